"""Pipeline stages: which layers a rank keeps, and a chunk's forward / backward one layer at a time.

A model chunk is a contiguous run of the layer list [Embed, Block 0..L-1, Head]: stage s of a pipeline with S
stages holds blocks [s*L/S, (s+1)*L/S), stage 0 also the Embed and stage S-1 also the Head. A rank keeps only
its chunks' layers (`planning.pipeline.schedules.Schedule.stage_of` says which stages).

Forward and backward are generators that yield after every layer, so the executor can interleave the forward of
one microbatch with the backward of another (DualPipe's overlapped F&B pair) and post each side's send the
moment its tensor is ready. Drive one to its end with `drive(gen)`, which returns the generator's result.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernels.block import Block
from kernels.comm import events
from kernels.model import Embed, Head, layer_span_name, named_params


@dataclass
class Chunk:
    """One model chunk on this rank: local index, global stage (within its direction) and its layers."""
    index: int
    stage: int
    stages: int
    layers: list

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1

    def params(self) -> dict:
        return named_params(self.layers)

    def block_range(self) -> str:
        idx = [layer.index for layer in self.layers if isinstance(layer, Block)]
        return f"layers {idx[0]}-{idx[-1]}" if len(idx) > 1 else f"layer {idx[0]}"


def split_stages(layers: list, stages: int) -> list[list]:
    """[Embed, Block..., Head] -> one layer list per stage (embed on the first, head on the last)."""
    assert isinstance(layers[0], Embed) and isinstance(layers[-1], Head), "expected [Embed, Block..., Head]"
    blocks = layers[1:-1]
    if len(blocks) % stages:
        raise ValueError(f"{len(blocks)} layers are not divisible by {stages} pipeline stages: pick layers a "
                         f"multiple of {stages}")
    per = len(blocks) // stages
    out = [blocks[s * per:(s + 1) * per] for s in range(stages)]
    out[0] = [layers[0]] + out[0]
    out[-1] = out[-1] + [layers[-1]]
    return out


def build_chunks(layers: list, schedule, pp_rank: int) -> list[Chunk]:
    """This rank's chunks, in local chunk order; every other stage's layers are dropped."""
    per_stage = split_stages(layers, schedule.stages)
    return [Chunk(c, schedule.stage_of(pp_rank, c), schedule.stages, per_stage[schedule.stage_of(pp_rank, c)])
            for c in range(schedule.chunks_per_rank)]


def forward_steps(chunk: Chunk, x, targets, denom, hooks):
    """Yields after each layer; returns (output, or the partial loss on the last stage; ctxs; aux loss)."""
    ctxs, aux = [], 0.0
    for layer in chunk.layers:
        hooks.before_forward(layer)
        with events.span(f"F {layer_span_name(layer)}", "layer"):  # leaf compute inside an F&B pair too
            if isinstance(layer, Head):
                x, c = layer.forward(x, targets, denom)   # x becomes the partial loss of this microbatch
            else:
                x, c = layer.forward(x)                   # [b, s, dim]
                aux = aux + getattr(c, "aux_loss", 0.0)   # MoE aux loss; its gradient comes from the MoE backward
        hooks.after_forward(layer)
        ctxs.append(c)
        yield
    return x, ctxs, aux


def backward_steps(chunk: Chunk, ctxs: list, dy, weights: bool, hooks):
    """Backward-input through the chunk in reverse (and weight grads too when `weights`); returns dx.
    On the last stage dy is None: the head starts from d(loss) = 1. On the first stage dx is None (ids)."""
    for layer, c in zip(reversed(chunk.layers), reversed(ctxs)):
        hooks.before_backward(layer)
        with events.span(f"B {layer_span_name(layer)}", "layer"):
            dy = layer.backward_input(c) if isinstance(layer, Head) else layer.backward_input(c, dy)
            if weights:
                layer.backward_weight(c)
        hooks.after_backward(layer)
        yield
    return dy


def weight_grads(chunk: Chunk, ctxs: list) -> None:
    """The deferred W of a split backward: every layer's weight grad from the dy its B stored."""
    for layer, c in zip(reversed(chunk.layers), reversed(ctxs)):
        layer.backward_weight(c)


def drive(gen):
    """Run a step generator to its end; returns its result."""
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value
