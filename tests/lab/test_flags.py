"""`partui run`'s flags: the one table from Plan fields to flags, applied to messages in field form."""
import argparse

import pytest

from partui.commands.flags import FLAG_OF, add_run_arguments, flagify, fields_from_args


@pytest.mark.parametrize("field_form, flag_form", [
    ("per-rank batch 8 is not divisible by 3 microbatches: use microbatches=8",
     "per-rank batch 8 is not divisible by 3 microbatches: use --microbatches 8"),
    ("interleaved 1F1B needs virtual_stages=2 or more",
     "interleaved 1F1B needs --virtual-stages 2 or more"),
    ("virtual_stages is for the interleaved schedule, not 1f1b",
     "--virtual-stages is for the interleaved schedule, not 1f1b"),
    ("sequence parallel needs tp > 1: drop sp=True or set tp=2",
     "sequence parallel needs tp > 1: drop --sp or set --tp 2"),
    ("capacity factor 0.0 must be > 0 (leave capacity_factor out for no limit)",
     "capacity factor 0.0 must be > 0 (leave --capacity-factor out for no limit)"),
    ("unknown cp_mode 'x': pick cp_mode=ring, zigzag or ulysses",
     "unknown --cp-mode 'x': pick --cp-mode ring, zigzag or ulysses"),
    ("bucket size -1.0 MB must be > 0: try bucket_mb=4.5.",
     "bucket size -1.0 MB must be > 0: try --bucket-mb 4.5."),
    ("drop backward=autograd (or those dims); lr=3e-3 is fine",
     "drop --backward autograd (or those dims); --lr 3e-3 is fine"),
    # plain words stay plain; flags already in flag form are left alone
    ("tp 3 does not divide 4 heads: pick tp in 1, 2, 4",
     "tp 3 does not divide 4 heads: pick tp in 1, 2, 4"),
    ("ZeRO-2 shards over data-parallel ranks but dp = 1: add --dp 2 (or more) or drop --zero",
     "ZeRO-2 shards over data-parallel ranks but dp = 1: add --dp 2 (or more) or drop --zero"),
    ("top_k 3 is more than 2 experts", "--top-k 3 is more than 2 experts"),
])
def test_field_form_reads_as_flags(field_form, flag_form):
    assert flagify(field_form) == flag_form


def test_every_field_in_the_table_is_a_run_flag():
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    flags = {s for a in p._actions for s in a.option_strings}
    assert set(FLAG_OF.values()) <= flags


def test_unset_flags_leave_the_plan_defaults_to_the_builder():
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    assert fields_from_args(p.parse_args([])) == {}
    fields = fields_from_args(p.parse_args(["--pp", "2", "--sp", "--virtual-stages", "1", "--layers", "2"]))
    # microbatches too stay the Plan's own default (0: the least the schedule takes, resolved
    # where the plan meets its model)
    assert fields == {"pp": 2, "sp": True, "virtual_stages": 1, "layers": 2}


def test_every_run_flag_has_help_and_its_values():
    """`partui run --help`: every flag says what it does in one line; a flag taking a value names
    its choices or its range (a metavar, or `>= 1` style words in the help)."""
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    for a in p._actions:
        if not a.option_strings or a.dest == "help":
            continue
        flag = a.option_strings[0]
        assert a.help and "\n" not in a.help, f"{flag} has no one-line help"
        if a.nargs != 0:
            assert a.choices or a.metavar, f"{flag} names neither its choices nor its range"
    helps = {a.option_strings[0]: a.help for a in p._actions if a.option_strings}
    assert "every parameter" in helps["--check"] and "every gradient" in helps["--check"]
    assert "dualpipev" in p.format_help() and "ulysses" in p.format_help()
