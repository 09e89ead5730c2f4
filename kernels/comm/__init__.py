"""The only door to torch.distributed (see core.py): named, timed, recorded ops; hand collectives
(collectives.py) register themselves here; handles and the event recorder live beside them."""
from kernels.comm.core import *  # noqa: F401,F403 - the comm API
from kernels.comm.core import (HAND_TAG_BASE, HAND_TAG_SPAN, P2P, Group, batch_isend_irecv,  # noqa: F401
                               p2p_step)
from kernels.comm.handles import Handle, OpLog, OpRecord, oplog  # noqa: F401
from kernels.comm import collectives  # noqa: F401,E402 - registers the hand collectives
