"""What a log states of its layout in words a program prints: Megatron's flags and config keys, the
world size by key, a program's count of its ranks, sizes in words or by short names, a device mesh,
NCCL's RAS job summary. ``launcher_flags`` reads them from a log's first lines (frames.layout_of
takes what Megatron's own lines and the launcher do not say)."""

from __future__ import annotations

import re
from collections.abc import Iterable

import ahocorasick_rs

from labkit.logs.deepspeed import neox_sizes, topology

# Megatron's parallel sizes by their names, as flags or keys, wherever a line states them: flags on a
# command line a launcher or script echoes (DeepSpeed's ``spawned with command: ['python', ...,
# '--tensor-model-parallel-size', '2', ...]``, a shell's ``+ torchrun ... --pipeline-model-parallel-size=4``,
# NeMo's ``model.tensor_model_parallel_size=2``), and the same names as keys of a config NeMo, MLPerf,
# verl or a YAML dump prints (``tensor_model_parallel_size: 4``, ``'context_parallel_size': 1,``, a
# printed TransformerConfig's ``tensor_model_parallel_size=2``). ``--model-parallel-size`` (Megatron v1,
# gpt-neox) is tensor parallel only as a flag: NeMo's model_parallel_size key is TP x PP.
_FLAG = re.compile(r"""(?:--|\bmodel\.|(?<![\w.-])['"]?)(tensor[-_]model|pipeline[-_]model|context|model)"""
                   r"""[-_]parallel[-_]size(?:['"]?\s{0,2}[=:]|['"]?,?[ \t]{1,4})\s{0,4}['"]?"""
                   r"(\d{1,6})(?![\d.])")
_FLAG_KEYS = {"tensor": "tp", "pipeline": "pp", "context": "cp", "model": "tp"}
# the sizes in words: ColossalAI's ``environment is initialized, data parallel size: 4, pipeline
# parallel size: 1, tensor parallel size: 1`` (data parallel: DP)
_SIZE_WORDS = re.compile(r"\b(data|pipeline|tensor|context) parallel size: (\d{1,6})(?![\d.])")
_WORD_KEYS = {"data": "dp", "pipeline": "pp", "tensor": "tp", "context": "cp"}
_GROUP_SIZE = re.compile(r"\b(DP|PP|TP|CP) group size: (\d{1,6})(?![\d.])")  # PiPPy's ``PP group size: 5``
# Megatron's groups as it builds them: ``> initialized tensor model parallel with size 8``, ``> initialized
# pipeline model parallel with size 1`` (``initializing model parallel with size 4``: v1's, TP)
_INITIALIZED = re.compile(r"initializ(?:ed|ing) (tensor|pipeline|data|context|model)(?: model)? parallel"
                          r" with size (\d{1,6})(?!\d)")
# PyTorch Lightning's DDP start: ``Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/16``
_MEMBER = re.compile(r"GLOBAL_RANK: \d{1,7}, MEMBER: \d{1,7}/(\d{1,7})\b")
# The world size stated in words or keys, anywhere in a line, by one rule: a key, then ``=``, ``:``
# or a config dump's dots, then a number or a list of numbers. What each key counts:
WORLD_KEYS = {
    "world_size": "ranks",  # world_size=24, WORLD_SIZE=8, world size: 24, "world_size": 8, DeepSpeed's
    #                         config dump world_size ........ 32, its mpi_discovery ... world_size=32,
    #                         a program's flag --world-size 8 / --world_size=8
    "distributed_world_size": "ranks",  # fairseq's distributed_world_size=8, --distributed-world-size 8
    "dist_world_size": "ranks",  # ESPnet's config print ``self.dist_world_size: 4``; DeepSpeed's launcher's
    "world_size_in_use": "ranks",  # ezpz's "WORLD_SIZE_IN_USE": 8
    "global_world_sizes": "ranks",  # torch elastic's rendezvous result: every local worker's world size
    "role_world_sizes": "ranks of one role",  # the world only where the job has one role: not read
    "group_world_size": "agents",  # torch elastic's agents (nodes), not ranks: not read
}
# Launcher arguments count a node's ranks or the nodes (``--nproc_per_node 4 --nnodes 2``,
# ``Using nproc_per_node=2``, an elastic ``min_nodes``/``max_nodes`` range) and state no world size
# (tests/fixtures/logs/real/README.md: the corpus reads them so); dist_world_size= and the WORLD
# INFO DICT are DeepSpeed's launcher's (deepspeed.py). A stated key is read after what Megatron's
# own lines and the launcher say (layout_of).
_WORLD = re.compile(r"(?i)(?:--|(?<![\w-]))((?:dist(?:ributed)?[_-])?world[_ -]size(?:_in_use)?"
                    r"|(?:global|role)_world_sizes|group_world_size)[\"']?\s{0,2}(?:[:=]|\s\.{3,80}|\s)\s{0,2}[\"']?"
                    r"(\d{1,7}(?![\d.])|\[[\d, ]{1,400}\])")


# Other lines that state how many ranks the job runs, by a program's own words. One table: a
# statement's words, the group holding the count, and the smallest count that states a world (what
# each counts is said beside it). A world size counts only where such a line states it.
_RANK_STATEMENTS = (
    # MLPerf's Mask R-CNN, per rank: ``dedicated_evaluation_ranks = 0, num_training_ranks = 8`` (the
    # ranks that train: the training world)
    (r"\bnum_training_ranks\s{0,2}[=:]\s{0,2}(\d{1,7})\b", 1),
    # MLPerf's BERT: ``device: cuda:0 n_gpu: 36, distributed training: True`` (its process group's
    # size). Hugging Face's examples print the same words with ``n_gpu: 1`` per process when
    # distributed (a GPU per rank, not the world), so an n_gpu of 1 says nothing; undistributed,
    # n_gpu counts one process's GPUs.
    (r"\bn_gpu: (\d{1,7}),? distributed training: True", 2),
    # a script's own ``print('Rank', dist.get_rank(), 'size', dist.get_world_size(), ...)``:
    # ``Rank 10 size 16 device cuda:2 count 8`` (the process group's size; ``rank=7/7`` and ``Rank
    # 3/8`` state a rank, not always with the size: no statement)
    (r"\b[Rr]ank[ :=]{1,3}\d{1,7},? [Ss]ize[ :=]{1,3}(\d{1,7})\b", 1),
    # a trainer spreading one model or run over all its devices: mistral-finetune's FSDP ``Sharding
    # model over 2 GPUs ...`` (over/across: the whole run; "on N GPUs" may be one node's, no
    # statement, but for fairseq's own words below)
    (r"\b(?:[Ss]hard|[Dd]istribut|[Rr]eplicat|[Pp]aralleli[sz])\w{0,4}(?: the)?(?: model)?"
     r" (?:over|across) (\d{1,7}) (?:GPUs|devices|ranks|processes)\b", 1),
    # a key that counts the job's processes, in a config print, a table row or an event: accelerate's
    # state ``Num processes: 8`` (its config's ``num_processes: 8``), llm.c's ``| num_processes | 1 |``,
    # ColBERT's ``nranks = 2``, llm.c's ``Started Multi Node training managed by Slurm: ProcessID:0,
    # NumProcess::4, DeviceId:0``, MLPerf's ``"key": "number_of_ranks", "value": 2080``, DeepBench's header
    # `` Num Ranks: 2`` (NCCL's ``comm ... rank 0 nranks 8`` and its collective trace's ``[nranks=2]`` are
    # one communicator's size: no statement)
    (r"(?<![\w\[-])(?i:num[_ ]?process(?:es)?|number_of_ranks|num[_ ]ranks|nranks)[\"']?"
     r"(?:[ \t]{0,40}[=:|]{1,2}[ \t]{0,12}|,[ \t]{0,2}\"value\":[ \t]{0,2})(\d{1,7})\b", 1),
    # in words: fairseq's ``training on 8 devices (GPUs/TPUs)`` (1.x; ``| training on 8 GPUs`` before),
    # timm's ``Training in distributed mode with multiple processes, 1 GPU per process. Process 0, total 8.``
    (r"\btraining on (\d{1,7}) (?:devices|GPUs)\b", 1),
    # torch's c10d before 2.0, every rank at the default group's start: ``Rank 0: Completed store-based
    # barrier for key:store_based_barrier_key:1 with 32 nodes.`` (its "nodes" are the group's ranks)
    (r"\bCompleted store-based barrier for key:\S{1,100} with (\d{1,7}) nodes\b", 1),
    (r"\bProcess \d{1,7}, total (\d{1,7})\b", 1),
    # a program's count of the GPUs it runs on: maskrcnn-benchmark's (and its forks') ``Using 8 GPUs``
    # (its WORLD_SIZE), fairseq 0.4's ``| using 3 GPUs (with max tokens per GPU = 2000 ...)``, Horovod's
    # benchmarks' ``Number of GPUs: 1`` (hvd.size()); not a count per node
    (r"\b[Uu]sing (\d{1,7}) GPUs\b(?! per)", 1),
    (r"\bNumber of GPUs: (\d{1,7})\b", 1),
    # gpt-neox's launcher, once, from its hostfile and the visible devices: ``INFO:ConfigMonster:Total
    # number of GPUs determined to be: 8`` (its global_num_gpus, the world)
    (r"\b[Nn]umber of GPUs determined to be: (\d{1,7})\b", 1),
    # an MPI program's communicator size (MLPerf's MXNet SSD: ``MPI size: 16``), its world
    (r"\bMPI size: (\d{1,7})\b", 1),
    # fairseq's banner over every rank's device, gathered from all of them: ``***CUDA enviroments for
    # all 8 workers***`` (its spelling)
    (r"\bCUDA envi\w{0,5}ments for all (\d{1,7}) workers\b", 1),
    # PyTorch Lightning's banner once every rank joined (its world): ``All distributed processes
    # registered. Starting with 32 processes``
    (r"\bprocesses registered\. Starting with (\d{1,7}) processes\b", 1),
    # a script's count of its workers: ``DDP: I am worker 2 of 8. My local rank is 2`` (a rank "of N",
    # ``Hi from rank 0 of 2``, states a rank, as ``Rank 3/8``: no statement)
    (r"\b[Ww]orker \d{1,7} of (\d{1,7})\b", 1),
    # accelerate's notice of the defaults it launched with: ``\`--num_processes\` was set to a value of
    # \`2\``` (its processes on every machine together)
    (r"`--num_processes` was set to a value of `(\d{1,7})`", 1),
)
_RANK_COUNT = re.compile("|".join(f"(?:{p})" for p, _ in _RANK_STATEMENTS))
# a cheap test before the table's pattern
_RANK_WORDS = ("n_gpu: ", "training_ranks", "ank", " GPUs", "devices", "rocess", "total ", "orker",
               "MPI size", "store-based barrier")


# DeepSpeed's engine's ``distributed groups summary`` (``self.dp_world_size=8``, ``self.mp_world_size=1``,
# ``self.seq_dp_world_size=8``): the first is the data-parallel group's size, DP; the model-parallel
# group's is not split into TP and PP, and a sequence-parallel run's seq_dp group is another group
_DP_WORLD = re.compile(r"(?<![\w-])dp_world_size\s{0,2}[=:]\s{0,2}(\d{1,7})\b")


def stated_rank_count(text: str) -> int | None:
    """The ranks a line of _RANK_STATEMENTS states, else None."""
    m = _RANK_COUNT.search(text)
    if m is None:
        return None
    for (_, least), value in zip(_RANK_STATEMENTS, m.groups(), strict=True):
        if value is not None:
            return int(value) if int(value) >= least else None
    return None


def stated_world_size(text: str) -> int | None:
    """The world size a line states by a key of WORLD_KEYS that counts ranks (a list of sizes
    gives its value where every entry agrees), else None."""
    for m in _WORLD.finditer(text):
        if WORLD_KEYS[re.sub("[ -]", "_", m.group(1).lower())] != "ranks":
            continue
        sizes = set(re.findall(r"\d{1,7}", m.group(2)))
        if len(sizes) == 1:
            return int(sizes.pop())
    return None


# torchtitan's device mesh: ``Building 2-D device mesh with ['dp_shard', 'tp'], [4, 2]`` (2024's:
# ``with ('dp',), [4]``; a name not in it is a dimension of size 1)
_MESH = re.compile(r"Building \d-D device mesh with [\[(]([\w', ]{1,200})[\])], \[([\d, ]{1,100})\]")
# or its sizes by name: ``Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=8, cp=1,
# tp=1, ep=1`` (expert parallelism, ep/etp, shares the other dimensions' ranks: no factor of the world)
_MESH_NAMED = re.compile(r"mesh with parallelism: ((?:\w{1,20}=\d{1,7}(?:, )?){1,12})")
_MESH_KEYS = {"dp": "dp", "dp_shard": "dp", "dp_replicate": "dp", "tp": "tp", "pp": "pp", "cp": "cp",
              "ep": None, "etp": None}
# a program's own statement of its layout by short names, in either case, ``=`` or ``:``: ``[env]
# world=4 tp=2 dp=2 ...``, ``Setting DP = 4, TP = 4, CP = 1, PP = 1``, ``TP: 4, PP: 3, CP: 1, DP: 2``,
# ``Initializing with world_size=8, dp_size=1, tp_size=1, pp_size=1, cp_size=8`` (MAGI-1).
# As a mesh's names, a dimension it does not name is of size 1 where the named ones multiply to the
# world it states; where it states none, DP, TP and PP all named make the world (else the line is no
# statement of the layout: nothing read). nanotron's logger prefix ``[INFO|DP=0|PP=0|TP=0]`` names the
# rank's coordinates, not the sizes: a name after ``|`` is none.
_NAMED_SIZE = re.compile(r"(?i)(?<![\w.|-])(world|tp|pp|dp|cp)(?:_size)?\s{0,2}[=:]\s{0,2}"
                         r"(\d{1,7})(?![\w./])")
HEAD_BYTES = 8 << 20  # launcher flags are looked for in a log's first 8 MB
# An inference engine's own parallelism is not the training's layout: verl's config names vLLM's or
# SGLang's sizes under its ``'rollout': {`` section (a dict printed by pprint, a YAML ``rollout:``), a
# teacher model's under ``'inference': {``, and Megatron's key names there
# (``'tensor_model_parallel_size': 1``) are the engine's. A section of one of these names runs while
# the lines' keys sit deeper than its own: a key's depth is counted from where the blanks before its
# line's first key begin, whatever prefix (Ray's, a glued progress bar) stands before them.
_ENGINES = "rollout|inference|vllm|sglang"
_SERVING = re.compile(rf"""(?:(?<=\s)|^)((['"])(?:{_ENGINES})\2:|^[ \t]*(?:{_ENGINES}):)\s?(?:\{{|$)""")
# a key: quoted anywhere (a prefix before a printed dict), else bare where the line starts (YAML)
_QUOTED_KEY = re.compile(r"""([ \t]*)['"][A-Za-z_][\w.-]{0,100}['"]:(?:\s|$)""")
_BARE_KEY = re.compile(r"^([ \t]*)[A-Za-z_][\w.-]{0,100}:(?:\s|$)")


class _Serving:
    """Whether a line lies inside a config section of an inference engine (_SERVING)."""

    def __init__(self) -> None:
        self.depth: int | None = None  # the depth of the open section's key
        self.quoted = False  # its key is quoted (a printed dict), not YAML's bare one

    def inside(self, text: str) -> bool:
        m = _QUOTED_KEY.search(text)
        if m is None and not (self.depth is not None and self.quoted):  # a printed dict's keys are quoted
            m = _BARE_KEY.match(text)
        if m is None:  # a line with no key (a list's next item): the section goes on
            return self.depth is not None
        if self.depth is not None and m.end(1) - m.start(1) <= self.depth:
            self.depth = None  # a key as shallow as the section's: the section ended
        if self.depth is None:
            s = _SERVING.search(text)
            if s is not None and s.start(1) >= m.end(1):
                self.depth, self.quoted = s.start(1) - m.start(1), s.group(2) is not None
        return self.depth is not None


# NCCL's RAS client (``ncclras``, 2.24 on) opens its report with a job summary, columns right-aligned
# under two header lines::
#
#       Nodes  Processes         GPUs  Processes     GPUs
#     (total)   per node  per process    (total)  (total)
#          32          8            1        256      256
#
# (where nodes differ: ``  Nodes  Processes         GPUs`` over ``(total)    (total)      (total)``):
# the value under ``Processes`` ``(total)`` counts the job's processes, its world size
_TOTAL = "(total)"
_FRAME = re.compile(rb'File "[^"]{1,500}", line \d{1,7}')


def _ras_processes(names: str, units: str, values: str) -> int | None:
    """The processes in total a RAS job summary's three lines state (_TOTAL), else None."""
    for m in re.finditer(re.escape(_TOTAL), units):
        end = m.end()
        v = re.search(r"(?<!\S)(\d{1,7})$", values[:end])
        if names[:end].endswith("Processes") and v and values[end:end + 1] in ("", " "):
            return int(v.group(1))
    return None


# every word launcher_flags looks for before its patterns: the flags', the world's, the rank
# statements' and the meshes' (``world=``, ``dp_world_size`` hold ``orld``; short names' ``TP``), the RAS
# summary's units (its line of values, the next one, is read with it)
_HEAD_WORDS = ("parallel", "MEMBER: ", "orld", "ORLD", "device mesh", "TP", "tp", _TOTAL, "ProcessCoord(",
               *_RANK_WORDS)
_DIGIT_BLIND = str.maketrans("123456789", "000000000")
_ENGINE_WORDS = ("rollout", "inference", "vllm", "sglang")  # _SERVING's sections
_AUTOMATON = ahocorasick_rs.BytesAhoCorasick([w.encode() for w in (*_HEAD_WORDS, *_ENGINE_WORDS)])


def launcher_flags(lines: Iterable[str] | Iterable[bytes], limit: int = HEAD_BYTES) -> dict[str, int]:
    """TP, PP and CP from Megatron's flags on the lines among the first ``limit`` bytes (the first
    value of each), the world size of PyTorch Lightning's ``MEMBER: 1/16``, stated in words or by a
    program's count of its ranks (_RANK_COUNT), DeepSpeed's data-parallel group size (_DP_WORLD) and
    its pipeline topology (deepspeed.topology), gpt-neox's keys (deepspeed.neox_sizes), Megatron's
    groups as it builds them (_INITIALIZED), the sizes in words (_SIZE_WORDS), and the sizes of a
    device mesh or of a program's ``world=N tp=T dp=D`` statement; ``v1``: the log is Megatron v1's."""
    out: dict[str, int] = {}
    serving = _Serving()
    last = ["", ""]  # the two lines read before this one (a RAS summary's headers)
    barren: set[str] = set()  # the digit-blind shapes of lines that stated nothing: their kin state nothing
    for raw in _worded(_head(lines, limit)):
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if ("rollout" in text or "inference" in text or "vllm" in text or "sglang" in text
                or serving.depth is not None) and serving.inside(text):
            continue
        shape, known = text.translate(_DIGIT_BLIND), len(out)
        if shape not in barren:  # (a log prints one line's shape for every rank and step)
            _read_flags(text, out)
            if len(out) == known and len(barren) < 4096:
                barren.add(shape)
        if _TOTAL in last[1] and "world_size" not in out:
            ws = _ras_processes(last[0].rstrip(), last[1].rstrip(), text.rstrip())
            if ws is not None:
                out["world_size"] = ws
        last = [last[1], text]
    return out


def _head(lines: Iterable[str] | Iterable[bytes], limit: int) -> list:
    head, seen = [], 0
    for raw in lines:
        seen += len(raw)
        if seen > limit:
            break
        head.append(raw)
    return head


def _worded(head: list) -> list:
    """The lines of ``head`` launcher_flags reads, in order: those holding one of _HEAD_WORDS (found
    in the joined text, not line by line: most lines of a log hold none), or every line where an
    inference engine's section may begin (_Serving follows its keys line by line)."""
    if not head:
        return []
    if len({type(line) for line in head}) > 1:  # lines of both kinds (parse_lines takes either): text
        head = [line.decode("utf-8", "replace") if isinstance(line, bytes) else line for line in head]
    nl = b"\n" if isinstance(head[0], bytes) else "\n"
    blob = nl.join(head)
    enc = (lambda w: w.encode()) if isinstance(blob, bytes) else (lambda w: w)
    enc_line = (lambda s: s) if isinstance(blob, bytes) else (lambda s: s.encode("utf-8", "replace"))
    starts: set[int] = set()
    if isinstance(blob, bytes):  # a file's lines: every word in one pass (a log's head is megabytes)
        hits = _AUTOMATON.find_matches_as_indexes(blob)
        if any(k >= len(_HEAD_WORDS) for k, _, _ in hits):  # an inference engine's word
            return head
        starts = {blob.rfind(nl, 0, i) + 1 for _, i, _ in hits}
    elif any(enc(w) in blob for w in _ENGINE_WORDS):
        return head
    for word in _HEAD_WORDS if not isinstance(blob, bytes) else ():
        w = enc(word)
        i = blob.find(w)
        while i >= 0:
            starts.add(blob.rfind(nl, 0, i) + 1)
            end = blob.find(nl, i)
            i = -1 if end < 0 else blob.find(w, end)
    if not starts:
        return []
    offsets, pos = {}, 0  # line start -> its index
    for n, line in enumerate(head):
        offsets[pos] = n
        pos += len(line) + 1
    picked = {offsets[s] for s in starts if s in offsets}
    # a traceback's code line is source, no statement (``    dist.init_process_group(..., world_size=2)``
    # under its frame's ``File "index.py", line 10, in <module>``)
    picked = {n for n in picked if n == 0 or _FRAME.search(enc_line(head[n - 1])) is None}
    picked |= {n + 1 for n in picked if n + 1 < len(head) and enc(_TOTAL) in head[n]}  # RAS's values
    return [head[n] for n in sorted(picked)]


def _read_flags(text: str, out: dict[str, int]) -> None:
    """The sizes one line states, into ``out`` (the first value of each wins)."""
    if "Using topology: {" in text:
        for key, v in topology(text).items():
            out.setdefault(key, v)
    if "pipe" in text and "parallel" in text:
        for key, v in neox_sizes(text).items():
            out.setdefault(key, v)
    if "parallel" in text:
        for m in _FLAG.finditer(text):
            if m.group(1) == "model" and not m.group(0).startswith("--"):
                continue
            out.setdefault(_FLAG_KEYS[re.split("[-_]", m.group(1))[0]], int(m.group(2)))
        for m in _SIZE_WORDS.finditer(text) if "parallel size: " in text else ():
            out.setdefault(_WORD_KEYS[m.group(1)], int(m.group(2)))
        for m in _INITIALIZED.finditer(text) if "with size" in text else ():
            out.setdefault(_WORD_KEYS.get(m.group(1), "tp"), int(m.group(2)))
            if m.group(1) == "model":  # Megatron v1's statement, as its ``using world size`` line
                out.setdefault("v1", 1)  # (frames.layout_of: no pipeline, unless the log states one)
    elif "MEMBER: " in text:
        m = _MEMBER.search(text)
        if m:
            out.setdefault("world_size", int(m.group(1)))
    if ("orld" in text or "ORLD" in text) and "world_size" not in out:
        ws = stated_world_size(text)
        if ws is not None:
            out["world_size"] = ws
    for m in _GROUP_SIZE.finditer(text) if "group size: " in text else ():
        out.setdefault(m.group(1).lower(), int(m.group(2)))
    if "dp_world_size" in text and "dp" not in out:
        m = _DP_WORLD.search(text)
        if m:
            out["dp"] = int(m.group(1))
    if "world_size" not in out and any(w in text for w in _RANK_WORDS):
        ws = stated_rank_count(text)
        if ws is not None:
            out["world_size"] = ws
    if "device mesh" in text or "world=" in text or "TP" in text or "tp" in text:
        for key, v in (_mesh(text) if "device mesh" in text else _named_sizes(text)).items():
            out.setdefault(key, v)


def _mesh(text: str) -> dict[str, int]:
    """A device mesh's sizes by dimension (empty where a name is not a known dimension)."""
    m = _MESH.search(text)
    if m is not None:
        names = [n.strip(" '") for n in m.group(1).split(",") if n.strip(" '")]  # ('dp',): a tuple
        sizes = [int(x) for x in m.group(2).replace(" ", "").split(",") if x]
    else:
        m = _MESH_NAMED.search(text)
        if m is None:
            return {}
        pairs = [p.split("=") for p in m.group(1).replace(" ", "").split(",") if p]
        names, sizes = [n for n, _ in pairs], [int(v) for _, v in pairs]
    if len(names) != len(sizes) or not all(n in _MESH_KEYS for n in names):
        return {}
    out = {"dp": 1, "tp": 1, "pp": 1, "cp": 1}
    for n, size in zip(names, sizes, strict=True):
        if _MESH_KEYS[n] is not None:
            out[_MESH_KEYS[n]] *= size
    out["world_size"] = out["dp"] * out["tp"] * out["pp"] * out["cp"]
    return out


def _named_sizes(text: str) -> dict[str, int]:
    """The layout a ``world=N tp=T dp=D`` statement gives (_NAMED_SIZE), else empty."""
    found = [(k.lower(), int(v)) for k, v in _NAMED_SIZE.findall(text)]
    named = dict(found)
    if len(named) < len(found) or 0 in named.values():  # a name twice, a size 0: no statement
        return {}
    world = named.pop("world", None)
    if world is None and {"dp", "tp", "pp"} <= set(named):
        world = named["dp"] * named["tp"] * named["pp"] * named.get("cp", 1)
    if world is None or not named:
        return {}
    out = {"dp": 1, "tp": 1, "pp": 1, "cp": 1} | named
    if out["dp"] * out["tp"] * out["pp"] * out["cp"] != world:
        return {}
    return {**out, "world_size": world}
