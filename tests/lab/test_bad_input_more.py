"""The bad-input table, second part (issue 35): more bad flags of run / plan / simulate / report /
blame / whatif / bench and of the top level, each exiting 2 with one line naming the problem, no
traceback and nothing on stdout, in this process (every row fails before a world or a bench starts).
The count over every table (test_bad_input.py's, this file's and the app's command-line grammar,
test_bad_input_app.py) is printed and held at 250 or more."""
import contextlib
import io
import shlex

import pytest

from conftest import ROOT
from partui.cli import main

SAMPLE = "traces/sample-dualpipev-ep.json.gz"
MORE_INPUTS = [  # (argv, words the last stderr line must hold)
    # ---- item 8: the fix offered is one the CLI takes
    ('plan --dp -1', 'pick dp in 1, 2, 4, 8'),
    ('plan --world 0', '--world 0: a world is 1 rank or more; leave --world out'),
    ('run --world 0', '--world 0: a world is 1 rank or more; leave --world out'),
    ('plan --world 100000', 'world 100000 must be <= 65536: pick world in 1, 2, 4, 8'),
    ('plan --dp 100000', 'dp 100000 must be <= 65536: pick dp in 1, 2, 4, 8'),
    ('plan --schedule foo', "(the schedule choices: gpipe, 1f1b, interleaved, zb1p, dualpipe, dualpipev): "
                            "set --schedule 1f1b"),
    ('plan --pp 2 --schedule foo', "(the schedule choices: gpipe, 1f1b, interleaved, zb1p, dualpipe, "
                                   "dualpipev): pick schedule in gpipe, 1f1b, zb1p, dualpipe"),
    ('plan --model deepseek-tiny --moe gshard',
     'routes the DeepSeek way (shared experts 1, route groups 2, seq aux alpha 0.0001, balance bias), but '
     '--moe gshard: drop --moe gshard, or set --model tiny --experts 8 --moe gshard'),
    ('plan --model deepseek-tiny --route-scale 0', 'set --route-scale 1.0 or no --route-scale'),
    ('plan --model deepseek-tiny --route-scale -2', 'set --route-scale 2.0 or no --route-scale'),
    ('plan --experts 4 --moe-hidden -1', 'set --moe-hidden 1 or no --moe-hidden'),
    ('plan --model deepseek-tiny --shared-experts -1', 'set --shared-experts 1 or no --shared-experts'),
    ('plan --model deepseek-tiny --route-groups 0', '--route-groups 0 must be >= 1: set no --route-groups'),
    ('plan --model deepseek-tiny --seq-aux-alpha -1', 'set --seq-aux-alpha 1.0 or no --seq-aux-alpha'),
    ('plan --model deepseek-tiny --bias-gamma -1', 'set --bias-gamma 1.0 or no --bias-gamma'),
    ('run --profile README.md', '--profile README.md is a file: --profile takes a folder'),
    ('run --profile /proc/x', 'folder /proc/x cannot be written'),
    ('whatif README.md --link h800', 'README.md: not valid JSON'),
    ('whatif traces --link h800', 'traces is a folder: name one trace file in it'),
    ('report README.md', 'README.md: not valid JSON'),
    # ---- item 9: conflicts refused
    ('plan --schedule dualpipe', "--schedule dualpipe orders a pipeline's stages, but there is none "
                                 "(pp 1): set --pp 2 --microbatches 4 or --schedule 1f1b"),
    ('plan --schedule 1f1b', "--schedule 1f1b orders a pipeline's stages, but there is none (pp 1): set "
                             "--pp 2 (or drop --schedule)"),
    ('run --schedule zb1p', "--schedule zb1p orders a pipeline's stages, but there is none"),
    ('plan --pp 1 --schedule gpipe', "--schedule gpipe orders a pipeline's stages"),
    ('--foo', 'partui: error: unrecognized arguments: --foo; the commands: run, plan'),
    ('-x', 'partui: error: unrecognized arguments: -x'),
    ('--verison', 'unrecognized arguments: --verison'),
    ('rn', "invalid choice: 'rn'"),
    ('Run', "invalid choice: 'Run'"),
    # ---- every choice named, and the fix valid
    ('plan --model deepseek-tiny --balance nope', "(the balance choices: none, bias): pick balance in none, bias"),
    ('plan --recompute half', "(the recompute choices: none, selective, full): pick recompute in none"),
    ('plan --dtype fp8', "(the dtype choices: fp32, bf16): pick dtype in fp32, bf16"),
    ('plan --zero 5', "unknown ZeRO stage 5 (the ZeRO stage choices: 0, 1, 2, 3): set --zero 0"),
    ('plan --model nope', 'pick one of tiny, small, medium, large, deepseek-tiny'),
    ('plan --model TINY', "unknown model preset 'TINY'"),
    # ---- numbers out of range, not finite, or not numbers
    ('plan --model deepseek-tiny --seq-aux-alpha inf', '--seq-aux-alpha inf is not a finite number: set --seq-aux-alpha 0'),
    ('plan --model deepseek-tiny --bias-gamma nan', '--bias-gamma nan is not a finite number: set --bias-gamma 0'),
    ('plan --model deepseek-tiny --route-scale inf', '--route-scale inf is not a finite number: set --route-scale 1'),
    ('plan --bucket-mb inf', 'bucket size inf is not a finite number: set --bucket-mb 4.0'),
    ('plan --experts 4 --capacity-factor -inf', 'capacity factor -inf is not a finite number'),
    ('plan --model deepseek-tiny --route-groups 3', 'must divide the 8 experts: pick --route-groups in 1, 2, 4, 8'),
    ('plan --model deepseek-tiny --route-topk-groups 5', 'must be between 1 and --route-groups 2'),
    ('plan --pp 2 --schedule interleaved --virtual-stages 0', '--virtual-stages 0 must be >= 1: set --virtual-stages 2'),
    ('plan --virtual-stages -1', '--virtual-stages -1 must be >= 1'),
    ('plan --pp 2 --microbatches 100000', 'microbatches 100000 must be <= 65536: pick microbatches in 2, 4, 8'),
    ('plan --experts 4 --top-k -1', 'top-k -1 must be >= 1: pick --top-k in 1, 2, 3, 4'),
    ('plan --experts 4 --top-k 100000', 'top-k 100000 must be <= 65536: pick --top-k in 1, 2, 3, 4'),
    ('plan --experts 100000', 'experts 100000 must be <= 65536: pick experts in 2'),
    ('plan --ep 100000', 'ep 100000 must be <= 1024: set --ep 1'),
    ('plan --cp 100000', 'cp 100000 must be <= 1024: pick cp in 1, 2, 4, 8, 16'),
    ('plan --kv-heads 0', 'model --kv-heads = 0 must be >= 1'),
    ('plan --heads 0', 'model heads = 0 must be >= 1'),
    ('plan --experts 4 --moe-every 0', 'model --moe-every = 0 must be >= 1'),
    ('plan --moe-every -1', 'model --moe-every = -1 must be >= 1'),
    ('plan --batch -1', 'model batch = -1 must be >= 1'),
    ('plan --layers -1', 'model layers = -1 must be >= 1'),
    ('plan --seq -4', 'model seq = -4 must be >= 1'),
    ('plan --dim -8', 'model dim = -8 must be >= 1'),
    ('plan --vocab -1', 'model vocab = -1 must be >= 1'),
    ('plan --dp 1.5', "argument --dp: invalid int value: '1.5'"),
    ('plan --pp two', "argument --pp: invalid int value: 'two'"),
    ('plan --bucket-mb x', "argument --bucket-mb: invalid float value: 'x'"),
    ('plan --experts 4 --capacity-factor abc', "argument --capacity-factor: invalid float value: 'abc'"),
    ('plan --sp -1', "argument --sp: ignored explicit argument '-1'"),
    ('plan --json --foo', 'unrecognized arguments: --foo'),
    # ---- plans the model or the schedule refuse, each with its fix
    ('plan --tp 2 --heads 3 --dim 48', 'kv heads must divide heads'),
    ('plan --kv-heads 5', 'heads 4 not divisible by kv heads 5'),
    ('plan --tp 4 --kv-heads 2 --heads 6', 'dim 64 is not divisible by heads 6'),
    ('plan --tp 8', 'tp 8 does not divide 4 heads: pick tp in 1, 2, 4'),
    ('plan --experts 4 --ep 2 --overlap --microbatches 3', 'not divisible by 3 microbatches: pick microbatches in 1, 2, 4'),
    ('plan --cp 2 --cp-mode zigzag --seq 6', 'seq 6 is not divisible by 4 (2 x cp 2) for zigzag: set --seq 8'),
    ('plan --cp 4 --cp-mode ulysses', 'set --cp-mode ring or --cp 2'),
    ('plan --cp 2 --seq 7', 'seq 7 is not divisible by 2 (cp 2) for ring: set --seq 8'),
    ('plan --sp --tp 2 --seq 7', 'seq must be a multiple of 2: set --seq 8 or no --sp'),
    ('plan --recompute full --experts 4', 'set --recompute none or --experts 0'),
    ('plan --pp 2 --fb-overlap --experts 4 --zero 3 --dp 2', 'set --zero 2 or no --fb-overlap'),
    ('plan --fb-overlap --experts 4', '--fb-overlap pairs a forward with a backward inside a pipeline'),
    ('plan --pp 2 --schedule dualpipev --microbatches 3', 'pick microbatches in 4, 8'),
    ('plan --pp 4 --schedule interleaved --virtual-stages 3', '(interleaved, pp 4, virtual 3): set --layers 12'),
    ('plan --pp 2 --schedule dualpipe --zero 3 --dp 2', 'set --zero 2 or --schedule 1f1b'),
    ('plan --pp 4 --schedule dualpipev --microbatches 2', '8 pipeline stages (dualpipev, pp 4): set --layers 8'),
    ('plan --pp 2 --layers 3', '3 layers are not divisible by 2 pipeline stages (1f1b, pp 2): set --layers 4'),
    ('plan --dp 3', 'global batch 8 is not divisible by dp 3: set --batch 9 or --dp 8'),
    ('plan --world 5', 'set --batch 10 or --dp 8 --world 8'),
    ('plan --world 2 --dp 4', 'set --world 4 or --dp 2'),
    ('plan --experts 3 --ep 2', '3 experts not divisible by ep 2: set --ep 1 or --experts 4'),
    ('plan --ep 2 --experts 4 --dp 3', 'global batch 8 is not divisible by dp 3: pick dp in 2, 4, 8'),
    ('plan --zero 1', 'ZeRO-1 shards over data-parallel ranks but dp = 1: set --dp 2 or --dp 4 or --zero 0'),
    ('plan --zero 3 --dp 1', 'ZeRO-3 shards over data-parallel ranks but dp = 1'),
    ('plan --moe deepseek', 'routes tokens to experts, but the model has none: set --experts 8'),
    ('plan --experts 4 --balance bias', '--balance bias is DeepSeek routing, but --moe gshard: add --moe deepseek'),
    ('plan --experts 4 --ep 2 --top-k 3 --dp 2 --overlap --batch 2', 'set --batch 4 or no --overlap'),
    ('plan --slow-rank 9=2', 'rank 9 is outside 0..0 (world 1): pick a rank in 0..0'),
    ('plan --slow-rank x', "--slow-rank 'x': give WHO=FACTOR, e.g. --slow-rank 1=1.5"),
    ('plan --slow-rank 0=0', 'the factor 0 must be >= 1'),
    ('plan --slow-rank 0=nan', 'the factor nan must be >= 1'),
    ('plan --pp 2 --slow-stage 5=2', 'stage 5 is outside 0..1 (pp 2): pick a stage in 0..1'),
    # ---- run's own flags
    ('run --lr inf', 'the learning rate must be > 0 (and finite); try --lr 1e-3'),
    ('run --lr -inf', '--lr -inf: the learning rate must be > 0'),
    ('run --weight-decay nan', 'weight decay must be >= 0 (and finite)'),
    ('run --timeout inf', '--timeout inf: seconds any command may take must be > 0'),
    ('run --timeout -inf', '--timeout -inf: seconds any command may take must be > 0'),
    ('run --steps 1.5', "argument --steps: invalid int value: '1.5'"),
    ('run --seed x', "argument --seed: invalid int value: 'x'"),
    ('run --optim adam', "invalid choice: 'adam' (choose from 'adamw', 'sgd')"),
    ('run --jsn', 'unrecognized arguments: --jsn'),
    ('run --trace traces/t.json --trace-steps -1:2', "--trace-steps '-1:2' is outside steps 0..5"),
    ('run --trace traces/t.json --trace-steps 9', "--trace-steps '9' is outside steps 0..5"),
    ('run --trace traces/t.json --trace-steps :', "--trace-steps ':' is not START:STOP (e.g. 2:4)"),
    ('run --trace traces/t.json --critical-path --trace-steps 0:0', 'pick START < STOP <= 5'),
    ('run --critical-path', '--critical-path marks the saved trace: add --trace PATH'),
    ('run --trace /proc', '--trace /proc is a folder: name a file in it, e.g. --trace /proc/run.json'),
    ('run --trace traces/t.json.bz2', 'name it .json or .json.gz, e.g. --trace traces/run.json'),
    ('run --link h900', '--link h900 is not a preset or a spec'),
    ('run --link alpha_us=1', 'needs both alpha_us and gbps, e.g. --link alpha_us=50,gbps=0.5'),
    ('run --link gbps=1', '--link gbps=1 needs both alpha_us and gbps'),
    ('run --link alpha_us=1,gbps=0', 'gbps a finite number > 0, e.g. --link alpha_us=50,gbps=0.5'),
    ('run --link alpha_us=1,gbps=-1', 'gbps a finite number > 0'),
    ('run --link alpha_us=x,gbps=1', "alpha_us='x' is not a number"),
    ('run --link alpha_us=1,gbps=nan', '--link alpha_us=1,gbps=nan: alpha_us must be a finite number'),
    ('run --link h800 --ranks-per-node -1', '--ranks-per-node -1: ranks on one node are 1 or more'),
    ('run --link h800 --ranks-per-node 3 --dp 2', 'must be >= 1 and divide world 2: pick a divisor of 2'),
    ('run --backward autograd --cp 2', 'with --cp 2 the forward itself communicates'),
    ('run --backward autograd --experts 4 --ep 2 --dp 2', 'with --ep 2 the forward itself communicates'),
    ('run --backward autograd --experts 4 --overlap', 'with --overlap the forward itself communicates'),
    # ---- simulate
    ('simulate --schedule 1f1b --pp 2 --microbatches -1', 'microbatches -1 must be >= 1; e.g. --microbatches 1'),
    ('simulate --schedule 1f1b --pp -1 --microbatches 4', '--pp -1: pp -1 must be >= 1; e.g. --pp 1'),
    ('simulate --schedule 1f1b --pp 2 --microbatches x', "argument --microbatches: invalid int value: 'x'"),
    ('simulate --schedule 1f1b --pp 2 --microbatches 4 --cost F=-1', 'cost F=-1 must be a finite number >= 0'),
    ('simulate --schedule 1f1b --pp 2 --microbatches 4 --cost F=inf', 'cost F=inf must be a finite number >= 0'),
    ('simulate --schedule 1f1b --pp 2 --microbatches 4 --cost F', "bad cost item 'F': write NAME=NUMBER"),
    ('simulate --schedule 1f1b --pp 2 --microbatches 4 --cost =1', "bad cost item '=1'"),
    ('simulate --schedule 1f1b --pp 2 --microbatches 4 --cost F=x', "cost F='x' is not a number"),
    ('simulate --schedule 1f1b --pp 2 --microbatches 4 --cost F=1,F=2', 'cost F is given twice (F=1,F=2)'),
    ('simulate --schedule 1f1b --pp 2 --microbatches 4 --parts ATTN=-1,MLP=1,A2A=1', 'parts ATTN=-1 must be a finite'),
    ('simulate --schedule 1f1b --pp 2 --microbatches 4 --parts ATTN=nan,MLP=1,A2A=1', 'parts ATTN=nan must be a finite'),
    ('simulate --schedule 1f1b --pp 2 --microbatches 4 --parts nothing.json', "bad parts item 'nothing.json'"),
    ('simulate --schedule zb1p --pp 2 --microbatches 1', 'zb1p needs microbatches >= pp = 2'),
    ('simulate --schedule dualpipev --pp 2 --microbatches 3', 'dualpipev needs microbatches >= 2 x pp = 4'),
    ('simulate --schedule interleaved --pp 2 --microbatches 4 --virtual-stages 0', 'unrecognized arguments'),
    ('simulate --pp 2 --microbatches 4', 'the following arguments are required: --schedule'),
    ('simulate --schedule gpipe --pp 2 --microbatches 4 --fb-overlap', 'use schedule=1f1b or dualpipe or dualpipev'),
    # ---- report
    ('report traces', 'not a torch.profiler trace; a directory holds one torch.profiler trace per rank'),
    ('report {S} --vs traces', 'not a torch.profiler trace'),
    ('report {S} --rows 0', '--rows 0: rows to print are 1 or more, or all; e.g. --rows 40 or --rows all'),
    ('report {S} --rows x', '--rows x: rows to print are 1 or more, or all'),
    ('report {S} --rows -5', '--rows -5: rows to print are 1 or more'),
    ('report {S} --by schedule --step 999', 'step 999 is not in this trace; pick one of its steps (1)'),
    ('report {S} --by schedule --step -1', 'step -1 is not in this trace'),
    ('report {S} --plot x.jpg', '--plot x.jpg: name it .png or .svg or .pdf'),
    ('report {S} --plot /proc/x.png', '--plot /proc/x.png: folder /proc cannot be written'),
    ('report {S} --memory --vs {S}', '--memory is a table of its own: drop --vs and --by'),
    ('report {S} --memory --by step', '--memory is a table of its own'),
    ('report {S} --routing --vs {S}', '--routing is a table of its own: drop --vs, --plot and --by'),
    ('report {S} --vs README.md', 'README.md: not valid JSON'),
    ('report {S} --by pair --format yaml', "invalid choice: 'yaml'"),
    ('report {S} --comm-kernels (', "--comm-kernels '(': not a valid regular expression"),
    # ---- blame
    ('blame nothing.json', 'nothing.json: no such file or directory'),
    ('blame README.md', 'README.md: not valid JSON'),
    ('blame traces', 'traces is a folder: name one trace file in it (.json or .json.gz)'),
    ('blame {S} --critical-path traces/x.txt', 'name it .json or .json.gz, e.g. --critical-path traces/marked.json'),
    ('blame {S} --format xml', "invalid choice: 'xml'"),
    # ---- whatif
    ('whatif {S} --link h800 --compute-scale 0', '--compute-scale 0.0 must be a finite number > 0'),
    ('whatif {S} --link h800 --compute-scale nan', '--compute-scale nan must be a finite number > 0'),
    ('whatif {S} --link h800 --microbatches 0', '--microbatches 0 must be >= 1'),
    ('whatif {S} --link h800 --pp -1', '--pp -1 must be >= 1'),
    ('whatif {S} --link h800 --pp 2 --floor', 'drop --compute-scale, --floor and --measured'),
    ('whatif {S} --link h800 --pp 2 --link-only', 'prices p2p by the link alone already: drop --link-only'),
    ('whatif {S} --recompute half', "invalid choice: 'half'"),
    ('whatif {S} --link alpha_us=1,gbps=0', 'gbps a finite number > 0'),
    ('whatif {S} --link h800 --measured nothing.json', 'nothing.json: no such file or directory'),
    ('whatif {S} --link h800 --measured README.md', 'README.md: not valid JSON'),
    ('whatif {S} --link h800 --ranks-per-node 3', 'divide world 4: pick a divisor of 4'),
    ('whatif {S} --link h800 --format xml', "invalid choice: 'xml'"),
    # ---- bench (argparse types: refused before torch or a world loads)
    ('bench soak --dp 0', 'argument --dp: 0 must be >= 1: e.g. --dp 4'),
    ('bench soak --dp -1', 'argument --dp: -1 must be >= 1'),
    ('bench soak --steps 0', 'argument --steps: 0 must be >= 1: e.g. --steps 1000'),
    ('bench soak --max-growth nan', 'argument --max-growth: nan must be above 0'),
    ('bench soak --history-lines 0', 'argument --history-lines: 0 must be >= 1'),
    ('bench step --rounds x', "argument --rounds: 'x' is not a whole number: e.g. --rounds 15"),
    ('bench step --models tiny,huge', 'unknown model preset(s) huge'),
    ('bench pp --microbatches 0', 'argument --microbatches: 0 must be >= 1: e.g. --microbatches 8'),
    ('bench fb --microbatches 0', 'argument --microbatches: 0 must be >= 1: e.g. --microbatches 4'),
    ('bench fb --seq -1', 'argument --seq: -1 must be >= 1'),
    ('bench launch --foo', 'unrecognized arguments: --foo'),
]


def refusal(argv: str) -> tuple[int, str, str]:
    """(exit code, stderr, stdout) of `partui ARGV` in this process, from the repository root."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(shlex.split(argv.replace("{S}", SAMPLE)))
        except SystemExit as e:                 # argparse's own refusals
            rc = e.code
    return rc, err.getvalue(), out.getvalue()


@pytest.mark.parametrize("argv,words", MORE_INPUTS, ids=[a for a, _ in MORE_INPUTS])
def test_more_bad_input_exits_2_with_one_line_naming_it(argv, words):
    rc, err, out = refusal(argv)
    assert rc == 2, (rc, err, out[-500:])
    last = err.strip().splitlines()[-1]
    assert last.startswith("partui"), err       # `partui CMD: ...`: the command is named
    assert words in last, last
    assert "Traceback" not in err and not out, err
