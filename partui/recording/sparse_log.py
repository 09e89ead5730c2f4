"""What viztracer's sparse mode logs in a rank: the functions a learner wants to see on the timeline.

kernels/ imports torch only, so the kernels carry no @log_sparse; while a sparse trace records,
`wrap_sparse` puts viztracer's own `log_sparse` around, in place on their classes:
  - each layer's forward, backward_input and backward_weight (every kernels.layers.base.Layer class),
  - the optimizer step (the grad sync's `optimizer_step` in kernels.dp, and every
    kernels.optim.Optimizer class's own `step` / `update`),
  - each schedule action (the pipeline executor's `do(action)`, in kernels.pp's classes).
The returned undo puts the original functions back (a later untraced step runs them bare).
"""
from __future__ import annotations

import inspect
import sys

from viztracer import log_sparse

from kernels.layers.base import Layer
from kernels.optim import Optimizer

LAYER_METHODS = ("forward", "backward_input", "backward_weight")
OPTIMIZER_METHODS = ("step", "update")  # update: the arithmetic, once per ZeRO / bucketed piece
SYNC_METHODS = ("optimizer_step",)      # the engine's call: the grad sync runs its optimizer
ACTION_METHODS = ("do",)                # the pipeline executor's dispatch of one schedule action


def _subclasses(root: type) -> list[type]:
    found, todo = [], [root]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def _classes_defining(package: str, names: tuple) -> list[type]:
    """Classes of the loaded modules under `package` that define one of `names` themselves."""
    mods = [m for name, m in list(sys.modules.items()) if name.startswith(package + ".") and m]
    return [cls for m in mods for _, cls in inspect.getmembers(m, inspect.isclass)
            if cls.__module__ == m.__name__ and any(k in vars(cls) for k in names)]


def targets() -> list[tuple[type, str]]:
    """(class, method name) of every function sparse mode logs, defined on that class itself."""
    groups = [(_subclasses(Layer), LAYER_METHODS), (_subclasses(Optimizer), OPTIMIZER_METHODS),
              (_classes_defining("kernels.dp", SYNC_METHODS), SYNC_METHODS),
              (_classes_defining("kernels.pp", ACTION_METHODS), ACTION_METHODS)]
    return [(cls, name) for classes, names in groups for cls in dict.fromkeys(classes) for name in names
            if callable(vars(cls).get(name))]


def wrap_sparse(viz) -> callable:
    """Wrap every target with `log_sparse` bound to `viz` (a VizTracer made with log_sparse=True);
    returns the undo. The wrapper times a call with viz.getts() and adds one "X" event (cat FEE)."""
    if viz is None or not viz.log_sparse:
        raise ValueError("wrap_sparse needs a VizTracer made with log_sparse=True")
    saved = []
    for cls, name in targets():
        fn = vars(cls)[name]
        saved.append((cls, name, fn))
        setattr(cls, name, log_sparse(fn))  # binds the tracer registered now (viz)

    def undo() -> None:
        for cls, name, fn in reversed(saved):
            setattr(cls, name, fn)
    return undo
