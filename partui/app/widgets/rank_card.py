"""One rank's card on the Run screen: coordinates, role, memory ledger, last step's compute /
comm / overlapped / exposed (the step line's figures: partui.world.results, defined as the report's,
partui.analysis.figures.definitions), and a spinner while a step is in flight on it."""
from __future__ import annotations

from rich.text import Text
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Static

from partui.world.results import overlap_pct

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def mb(nbytes) -> str:
    return "—" if nbytes is None else f"{nbytes / 2**20:.2f}"


def card_figures(item: dict) -> str:
    """A rank's step figures as its card shows them, the report's names shortened."""
    pct = overlap_pct(item)
    return (f"comp {item['compute_ms']:.1f} comm {item['comm_ms']:.1f} ms\n"
            f"ovl {item['overlapped_ms']:.1f} {'—' if pct is None else f'{pct:.0f}%'}"
            f" exp {item['exposed_comm_ms']:.1f} ms\nstep {item['window_ms']:.0f} ms")


class RankCard(Static):
    """Data comes from the rank's setup info and its last step summary; nothing is made up."""

    busy = reactive(False)
    selected = reactive(False)

    class Selected(Message):
        def __init__(self, rank: int):
            super().__init__()
            self.rank = rank

    def __init__(self, info: dict, **kw):
        super().__init__(**kw, classes="rank-card")
        self.info = info
        self.last: dict | None = None
        self.rank = info["rank"]
        self._frame = 0
        self._timer = None

    def on_mount(self) -> None:
        self._timer = self.set_interval(0.1, self._spin, pause=True)
        self.refresh_text()

    def update_step(self, item: dict) -> None:
        self.last = item
        self.refresh_text()

    def watch_busy(self, busy: bool) -> None:
        if self._timer is not None:
            self._timer.resume() if busy else self._timer.pause()
        self.refresh_text()

    def watch_selected(self, sel: bool) -> None:
        self.set_class(sel, "-selected")

    def _spin(self) -> None:
        self._frame += 1
        self.refresh_text()

    def refresh_text(self) -> None:
        i, s = self.info, self.last
        spin = SPINNER[self._frame % len(SPINNER)] if self.busy else " "
        t = Text()
        t.append(f"rank {self.rank}", style="bold")
        t.append(f"  {i['label']}", style="cyan")
        t.append(f" {spin}\n", style="yellow")
        t.append(f"{i.get('role') or '—'}\n", style="dim")
        led = (s or {}).get("ledger") or i.get("ledger") or {}
        t.append(f"MB p {mb(led.get('params'))} g {mb(led.get('grads'))} "
                 f"o {mb(led.get('optimizer'))}\n")
        if s is None:
            t.append("no step yet", style="dim")
        else:
            t.append(card_figures(s))
        self.update(t)

    def on_click(self) -> None:
        self.post_message(self.Selected(self.rank))
