"""Pipeline parallelism: schedules as data, their simulation, and the executor that runs them.

    actions    the data model: Action, Schedule, the SEND / RECV transfers around computes
    schedules  the catalogue: gpipe, 1f1b, zb1p, interleaved, and build_schedule by name
    dualpipe   DualPipe and DualPipeV (DeepSeek-V3) in their eight phases
    simulate   a schedule replayed as a dataflow under a cost model: timeline, bubble, memory
    stages     which layers a rank keeps, and a chunk's forward / backward one layer at a time
    executor   one pp rank's action list run for real over async p2p
"""
