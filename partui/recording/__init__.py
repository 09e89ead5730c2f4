"""Recording: each rank's trace (trace, sparse_log), torch.profiler (profile), the ranks merged into one
Chrome trace (tracefile), and the machine it was recorded on (machine)."""
