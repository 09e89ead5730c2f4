"""The lab core: a plan built (plans), laid out on paper (layout), launched (launch, worker, rank), driven
(controller, `World`) and shown (snapshot, tables, results, show_kinds); `--check` (checker); torchrun."""
