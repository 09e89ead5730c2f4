"""Every listener of a world is on loopback: the rendezvous store (rank 0's TCPStore binds every
interface unless handed a loopback socket) and gloo's own sockets, in partui's World and in the
fork world the benches and tests use. Read from /proc: the sockets each process holds, and the
address each listening one is bound to."""
import os

from partui.world.world import World
from worlds import run_world

LISTEN = "0A"                      # TCP state LISTEN in /proc/net/tcp*


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(link[8:-1])
    return out


def _listeners(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket `pid` holds in LISTEN state."""
    mine, out = _socket_inodes(pid), []
    for table, width in (("tcp", 8), ("tcp6", 32)):
        with open(f"/proc/{pid}/net/{table}") as f:
            for row in f.read().splitlines()[1:]:
                cols = row.split()
                addr, port = cols[1].split(":")
                if cols[3] == LISTEN and cols[9] in mine:
                    out.append((_address(addr, width), int(port, 16)))
    return out


def _address(hex_addr: str, width: int) -> str:
    if width == 8:                                    # little-endian IPv4
        return ".".join(str(int(hex_addr[i:i + 2], 16)) for i in (6, 4, 2, 0))
    words = [hex_addr[i:i + 8] for i in range(0, 32, 8)]     # four little-endian 32-bit words
    raw = "".join(w[6:8] + w[4:6] + w[2:4] + w[0:2] for w in words)
    return ":".join(raw[i:i + 4] for i in range(0, 32, 4))


LOOPBACK_V6 = "0000:0000:0000:0000:0000:0000:0000:0001"


def _off_loopback(listeners):
    return [(a, p) for a, p in listeners if not (a.startswith("127.") or a == LOOPBACK_V6)]


def test_address_decoding_on_known_rows():
    assert _address("0100007F", 8) == "127.0.0.1"
    assert _address("00000000", 8) == "0.0.0.0"
    assert _address("00000000000000000000000001000000", 32) == LOOPBACK_V6


def test_a_world_listens_on_loopback_only():
    with World(timeout_s=60) as w:
        w.plan("dp", dp=2)
        w.launch()
        w.step(1)
        listeners = {pid: _listeners(pid) for pid in [os.getpid(), *w.pids()]}
    everything = [x for ls in listeners.values() for x in ls]
    assert len(everything) >= 2, f"expected the store and gloo's listeners, saw {listeners}"
    assert not _off_loopback(everything), f"listening off loopback: {listeners}"


def _my_listeners(rank, size):
    return _listeners(os.getpid())


def test_a_fork_world_listens_on_loopback_only():
    per_rank = run_world(2, _my_listeners, timeout_s=60)
    assert per_rank[0], "rank 0 should hold the store's listener"
    assert not _off_loopback([x for ls in per_rank for x in ls]), per_rank
