"""What a torch.profiler GPU event is: its kind (kineto_kinds), its comm family (comm_families,
comm_kernels), the step that launched it and the kernels that count (gpu_steps, gpu_kernels), HTA's launch
filter (hta_filter) and its F&B pair part (pair_parts). The readers apply these rules while reading."""
