"""Commands for people (entry-point layer): one-shot reads of a cluster, answered by the shared model."""
