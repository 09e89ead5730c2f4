"""Pipeline schedules as data (torch-free): one record per schedule, the builders, and what can be
asked of a schedule before it runs.

    catalog     one ScheduleSpec per schedule: its builder, chunks, directions, microbatch rule,
                activations in flight, bubble formula, what it combines with, accumulations;
                register_schedule, build_schedule, plan_schedule
    actions     the data model: Action, Schedule, the SEND / RECV transfers around computes
    schedules   the builders of gpipe, 1f1b, zb1p, interleaved; check_schedule
    dualpipe    DualPipe and DualPipeV (DeepSeek-V3) in their eight phases
    simulate    a schedule replayed as a dataflow under a cost model (on planning.replay)
    timeline    the schedule grid as text
    fb_order    DeepSeek's parts of a layer and the overlapped F&B pair's order, as data
    part_costs  chunk-level costs: F, BW and the overlapped pair on a compute and a comm stream
"""
