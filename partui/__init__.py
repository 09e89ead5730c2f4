"""partui: the laboratory around `kernels` — world launcher, worker, snapshots, traces, analysis,
CLI and terminal app. Light to import: `partui.World` loads on first use."""

__all__ = ["World"]


def __getattr__(name):
    if name == "World":
        from partui.session import World
        return World
    raise AttributeError(f"module 'partui' has no attribute {name!r}")
