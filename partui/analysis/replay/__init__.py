"""Replay on planning.replay: a recorded step as an op graph (opgraph, partui_graph, bytedance_graph,
graph_replay), what-if under another link, pipeline or recompute (whatif, whatif_pipe, whatif_recompute),
and who made a step slow (blame, blame_marks)."""
