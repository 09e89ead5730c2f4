"""Pipeline parallelism: schedules as data, their simulation, and the executor that runs them.

    actions    the data model: Action, Schedule, the SEND / RECV transfers around computes
    schedules  the catalogue: gpipe, 1f1b, zb1p, interleaved, and build_schedule by name
    dualpipe   DualPipe and DualPipeV (DeepSeek-V3) in their eight phases
    simulate   a schedule replayed as a dataflow under a cost model (on kernels.replay): timeline,
               bubble, memory
    stages     which layers a rank keeps, and a chunk's forward / backward one layer at a time
    executor   one pp rank's action list run for real over async p2p (the runner)
    step       one step of it: the p2p mailbox and the F / B / BW / W / FB actions
    fb_order   DeepSeek's parts of a layer and the overlapped F&B pair's order, as data (torch-free)
    parts      a chunk's forward / backward cut into those parts; run_pair (fb_overlap)
    part_costs chunk-level costs: F, BW and the overlapped pair on a compute and a comm stream
"""
