CpuOffload = offload = None
