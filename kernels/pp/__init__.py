"""Pipeline parallelism, run for real: the executor that walks a schedule's action list on a rank.
The schedules themselves are data, in planning/pipeline (catalogue, builders, simulator).

    stages     which layers a rank keeps, and a chunk's forward / backward one layer at a time
    executor   one pp rank's action list run for real over async p2p (the runner)
    step       one step of it: the p2p mailbox and the F / B / BW / W / FB actions
    parts      a chunk's forward / backward cut into DeepSeek's parts; run_pair (fb_overlap)
"""
