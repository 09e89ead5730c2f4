"""partui and partui.analysis export their names lazily: importing the packages loads neither the
world nor pandas, and every public name still resolves to its module's own object."""
import importlib
import subprocess
import sys

import partui
import partui.analysis as analysis


def test_importing_the_packages_loads_neither_pandas_nor_the_world():
    code = ("import sys, partui, partui.analysis, partui.analysis.figures.definitions; "
            "print(sorted(m for m in ('pandas', 'partui.world.world', 'partui.analysis.figures.metrics') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


# the names partui.analysis exported eagerly before, each with the module that defines it
HOMES = {"replay.blame": ["blame_line", "blame_text"], "figures.definitions": ["definitions_of"],
         "table.events": ["COLUMNS", "TraceError"],
         "figures.metrics": ["hta_overlap", "overlap", "overlap_views", "oversubscription_note", "step_times"],
         "figures.pairs": ["fb_pair_a2a", "pair_summary"], "replay.partui_graph": ["partui_graphs"],
         "figures.pipeline": ["theoretical_bubble"], "reading.reader": ["detect", "frame", "load", "read_doc"],
         "replay.whatif": ["SAVED_COLUMNS", "saved"]}


def test_every_public_name_resolves_to_its_modules_object():
    assert partui.World is importlib.import_module("partui.world.world").World
    assert sorted(analysis.__all__) == sorted(n for names in HOMES.values() for n in names)
    for module, names in HOMES.items():
        home = importlib.import_module(f"partui.analysis.{module}")
        for name in names:
            assert getattr(analysis, name) is getattr(home, name), name
    assert set(dir(analysis)) >= set(analysis.__all__)


def test_an_unknown_name_is_an_attribute_error():
    for module in (partui, analysis):
        try:
            module.no_such_name
        except AttributeError as exc:
            assert "no_such_name" in str(exc)
        else:
            raise AssertionError(f"{module.__name__}.no_such_name resolved")
