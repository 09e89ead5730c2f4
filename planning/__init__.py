"""Torch-free planning maths: what a plan is, whether it fits its model, and what it will do, all
computed on paper before any process starts.

    field_spec       plan_field: one line that becomes a flag, a grammar word and a form field
    mesh             Plan (its fields grouped by concern), dimensions, groups, rank coordinates
    config           ModelConfig and the model presets
    validate         every check of a Plan against its model, each with fixes that validate
    moe_families     the MoE families and their routing fields
    routing_figures  the routing observatory's arithmetic
    slow_spec        a straggler on purpose, parsed
    memory_estimate  a plan's memory from its sizes alone, and the refusal of one that would not fit
    link             the emulated interconnect's alpha-beta model
    replay           the one replay core (ops, lanes, dependencies) the simulator, what-if and blame run on
    intervals        interval maths and the one definition of a window's figures
    pipeline/        schedules as data: the catalogue, the builders, simulation, the timeline, F&B pairs

Nothing here imports torch, kernels or partui (tests/lab/test_house.py holds it), so `partui plan`,
`partui simulate`, validation and the analysis run without loading torch.
"""
