"""The node agent: this node's GPUs, from sysfs and kubelet, into its GPUNode (SPEC §6, R-AGENT).

    sysfs.py      PCI functions, mdevs, IOMMU groups, vGPU VFs (sync file reads, injectable root)
    kubelet.py    pod-resources gRPC over kubelet's unix socket (allocatable, pods' devices)
    inventory.py  pure: both views -> status.devices / status.resourceNames, IDs placed by shape
    pods.py       are the pods kubelet lists still holding their devices? (API lookups)
    report.py     merge-patch of the agent's own status fields of its own GPUNode
    runner.py     the loop: read, judge, write on change and periodically, back off on failure
    command.py    ``cozygpu agent`` flags and the process
"""
