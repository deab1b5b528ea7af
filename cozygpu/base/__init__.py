"""The bottom layer every part stands on: clock, deadline, backoff, durations, logger, env flags.

It imports nothing of ours and does no I/O of its own (the logger writes to a
stream it is handed). ``cozygpu.model`` does not import it: the model reads no clock.
"""
