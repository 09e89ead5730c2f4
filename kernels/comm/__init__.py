"""The only door to torch.distributed: named, timed, recorded ops.

    core.py         the world, named groups, recorded collectives (native, or hand when set)
    store.py        the loopback rendezvous store; torch's own flight recorder dumped
    p2p.py          recorded send / recv, batched exchanges, the steps of hand collectives
    lanes.py        where hand collectives run: a thread per group, links, tags, segments
    collectives.py  the hand rings, chains and pairwise exchanges (registered with core here)
    handles.py      in-flight op handles and the always-on op log
    poster.py       the comm thread that posts a marked group's ops (the caller does not pay)
    events.py       the recorder hook (compute spans, comm ops, counters)
    flight.py       every op's identity (Seq, Comms Id) and the ring of each rank's last ops
    faults.py       faults on purpose (--fault): which op misbehaves, and how
    validate.py     --validate-comms: each collective's op, sizes, dtypes compared before it runs

This package gathers the API (`from kernels import comm; comm.all_reduce(...)`); the modules
inside import each other directly, never through here.
"""
from kernels.comm import collectives  # registers the hand collectives with core
from kernels.comm.core import (
                               COLLECTIVES,
                               Group,
                               RendezvousError,
                               all_gather,
                               all_reduce,
                               all_to_all_single,
                               barrier,
                               broadcast,
                               default_backend,
                               destroy,
                               init,
                               is_initialized,
                               new_groups,
                               reduce_scatter,
                               set_collectives,
                               set_validate,
                               single_group,
                               wait_all,
                               world_group,
                               world_rank,
                               world_size,
)
from kernels.comm.dry import dry_rank
from kernels.comm.handles import Handle, OpLog, OpRecord, oplog
from kernels.comm.p2p import (
                               HAND_TAG_BASE,
                               HAND_TAG_SPAN,
                               P2P,
                               batch_isend_irecv,
                               irecv,
                               isend,
                               p2p_step,
                               recv,
                               send,
)
from kernels.comm.poster import post_from_thread
from kernels.comm.store import (
                               dump_torch_flight_recorder,
                               launcher_store,
                               store_client,
                               store_server,
)

__all__ = ["COLLECTIVES", "Group", "RendezvousError", "all_gather", "all_reduce", "all_to_all_single",
           "barrier", "broadcast", "default_backend", "destroy", "dump_torch_flight_recorder", "dry_rank", "launcher_store", "init", "is_initialized", "new_groups",
           "reduce_scatter", "set_collectives", "set_validate", "single_group", "store_client", "store_server",
           "wait_all", "world_group", "world_rank", "world_size",
           "Handle", "OpLog", "OpRecord", "oplog",
           "HAND_TAG_BASE", "HAND_TAG_SPAN", "P2P", "batch_isend_irecv", "irecv", "isend",
           "p2p_step", "recv", "send", "post_from_thread",
           "collectives"]
