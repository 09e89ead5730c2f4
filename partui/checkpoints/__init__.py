"""Checkpoints, the controller's side: where one lives and what is refused (checkpoint), and the reshard on
paper (reshard_map). The ranks' side is kernels.checkpoint."""
