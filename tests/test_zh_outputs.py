"""The stored outputs of the Chinese notebooks (lessons/zh, labs/zh, solutions/zh) print Chinese: every
label a lesson, lab or library prints goes through the message catalogues. English is allowed only for
what stays English in Chinese text: collective names, identifiers (anything with ``_``, ``.``, ``(``,
digits or camelCase), environment variables, command-line options, ``key=value``, quoted strings,
code spans, paths, URLs, units and the proper names in ALLOWED.

What else is still English is listed per notebook in LEFT: text the course quotes rather than writes
(PyTorch's and NCCL's own logs, warnings and tracebacks, generated job files, layer and method names
used as keys). A new English word in a Chinese output fails; so does a LEFT entry no longer needed."""
from __future__ import annotations

import json
import re

import pytest

from conftest import ROOT

KINDS = ("lessons", "labs", "solutions")
SKIP: set[str] = set()

ALLOWED = set("""
All Reduce Gather Scatter Broadcast all reduce gather scatter broadcast send recv isend irecv barrier
rank ranks True False None Any Union
torch PyTorch torchrun NCCL nccl gloo Gloo DeepSpeed FSDP FSDP2 DDP ZeRO DTensor GPipe Megatron MPI CUDA
GPU GPUs CPU cpu cuda bf fp NVLink PCIe InfiniBand RoCE IB SHM P2P RDMA GPUDirect TCP Adam AdamW SGD MLP
TP PP DP CP EP MoE MFU oneDNN Linux SLURM Slurm Kubernetes Docker OOM
B KB MB GB TB KiB MiB GiB TiB Gb GB/s Gb/s s ms us ns h min e max min log exp sqrt inf nan
N M K F p m k n v w x y g b c
""".split())

# Quoted, not written, by the course: what is left, by notebook (kind/stem) and word.
LEFT: dict[str, set[str]] = {
    "lessons/00_torchrun_process_group": set("""RANK Timed address at bad bash batch command complete entrypoint evaluate for found frozen in line local localhost main module node not nproc on operation out runpy set stderr stdout step this to waiting wrapper your""".split()),  # noqa: E501
    "lessons/01_collective_communication": set("""a after before floats got in naive on ring sent step world""".split()),  # noqa: E501
    "lessons/02_data_parallel": set("""Expected a batch before buckets finished forward have in iteration loss naive new one prior reduction starting the to""".split()),  # noqa: E501
    "lessons/02b_data_parallel_practice": set("""XPU be entrypoint epoch exact expected forward in input loss main module on or padded privateuseone tensor to""".split()),  # noqa: E501
    "lessons/03_accumulation_mixed_precision": set("""Please accumulation autocast batch deprecated dtype effective eps init instead is linear matmul micro optimizer ours parameter relu scale size softmax steps sum use weight world""".split()),  # noqa: E501
    "lessons/04_gradient_compression": set("""none numel powersgd state top topk""".split()),  # noqa: E501
    "lessons/05_zero_fsdp": set("""Shard block dtype head partial""".split()),  # noqa: E501
    "lessons/06_deepspeed": set("""DCP Offload adam args client distcp false latest metadata model optimizer true""".split()),  # noqa: E501
    "lessons/07_model_tensor_parallel": set("""Block GPT L Shard attention block column full input mlp param replicated row token""".split()),  # noqa: E501
    "lessons/08_pipeline_parallel": set("""dp pp tp""".split()),  # noqa: E501
    "lessons/09_checkpoint_recovery": set("""Checkpoint MTBF OSError RNG SIGKILL Skipping at back by checkpoint ckpt commit data diff exit fails falling fault footer has incomplete injection is it loader mode no not one optimizer or previous rng sigkill stall step store the to was written""".split()),  # noqa: E501
    "lessons/10_hangs_and_deadlocks": set("""C DETAIL Detected EADDRINUSE OFF Rank Ranks SIGSEGV The abort address already any at autograd backward batch between by code collectives enforce entrypoint fail failed false frozen has in killed listen local loss main message mismatch module name network on pass port runpy server socket timeout to train use vs""".split()),  # noqa: E501
    "lessons/11_nccl_networking": set("""BOOTSTRAP Debugging ECONNREFUSED EHOSTUNREACH ENV ETIMEDOUT INIT LL NVLS NVLSTree PAT PXB Python Ring Simple System TRACE Tree UP Verbs a case combination configuration conflict debugging deprecated error file infinite info local not removed renamed rendezvous shared socket syntax timeout unknown value variable warning watchdog wrong""".split()),  # noqa: E501
    "lessons/13_context_expert_parallel": set("""Operator P SDPA a contiguous cp dk does dp dq dv f have key not query registered sharding strategy to token top zag zig zigzag""".split()),  # noqa: E501
    # 14: most of it is format_plan's output, the planner presets' source sentences and assumption lines (issue 24)
    "lessons/14_composing_and_planning": set("""Core Dubey FFN FLOPs Herd KV LM Latencies Llama Models NIC NVIDIA SXM Table Tensor The Transformer a al and are as assumptions at attention autograd checkpoint course cp d datasheet dense dim dp each edp efficiency ep et few figures flash from heads in layers logits mixed model network not nvlink of one per perfmodel pp q released ring roofline section server sparsity sum the this tile to token tp vocab way with zag zig""".split()),  # noqa: E501
    "lessons/12_multinode_clusters": set("""Check Debugging Gi INFO Indexed Job Memory Never One SBATCH SIGPIPE Service The Written against agent assigns before by can cluster command completions container containers ddp default distributed dshm each end env exited export first get grep has head hostnames hosts image info is it job kind limits may medium memory metadata micro mlp name namespace node of once one output parallelism per pipefail port ports pytorch rdzv reads rendezvous replicas requests resources runtime scontrol script sed selector set show spec srun starts subdomain task template that the trainer true value volumes warning with workers your""".split()),  # noqa: E501
    "labs/lab_02_ddp": set("""Overwriting bytes""".split()),  # noqa: E501
    "labs/lab_04_compression": set("""Top Writing average indices reduced values want we""".split()),  # noqa: E501
    "labs/lab_05_zero": set("""NUMEL Overwriting scale""".split()),  # noqa: E501
    "labs/lab_08_pipeline": set("""Overwriting""".split()),  # noqa: E501
    "labs/lab_09_recovery": set("""Writing""".split()),  # noqa: E501
    "labs/lab_10_deadlocks": set("""Overwriting Writing batch""".split()),  # noqa: E501
    "labs/lab_11_nccl": set("""Writing error warning""".split()),  # noqa: E501
    "labs/lab_13_context_expert": set("""Writing attention ring softmax to""".split()),  # noqa: E501
    "solutions/lab_02_ddp": set("""Overwriting bytes""".split()),  # noqa: E501
    "solutions/lab_04_compression": set("""Top Writing average indices reduced values want we""".split()),  # noqa: E501
    "solutions/lab_05_zero": set("""NUMEL Overwriting flat padding scale""".split()),  # noqa: E501
    "solutions/lab_08_pipeline": set("""Overwriting""".split()),  # noqa: E501
    "solutions/lab_09_recovery": set("""Writing""".split()),  # noqa: E501
    "solutions/lab_10_deadlocks": set("""Writing batch""".split()),  # noqa: E501
    "solutions/lab_11_nccl": set("""Writing error warning""".split()),  # noqa: E501
    "solutions/lab_13_context_expert": set("""Writing attention ring softmax to""".split()),  # noqa: E501
}


def clean(text: str) -> str:
    """The text without what may stay English: code spans, quoted strings, URLs, paths, env vars,
    options and key=value."""
    for rx in (r"`[^`\n]*`", r"'[^'\n]*'", r'"[^"\n]*"', r"https?://\S+", r"[\w.]+=\S*", r"(?:[\w.\-]*/)+[\w.\-]+",
               r"\$?\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b", r"(?<![\w-])--?[A-Za-z][\w-]*"):
        text = re.sub(rx, " ", text)
    return text


TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9_.]*(?:\([^)\n]*\))?")


def english_words(text: str) -> list[str]:
    out = []
    for m in TOKEN.finditer(clean(text)):
        word = m.group(0).rstrip(".")
        if re.search(r"[_.(0-9]", word) or re.search(r"[a-z][A-Z]", word) or word in ALLOWED:
            continue
        out.append(word)
    return out


def stored_text(path) -> list[tuple[int, str]]:
    """(cell index, text) of every stored text output (code listings shown with ``show`` are code, and
    the same in both languages: only what cells print is checked)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [(i, "".join(o.get("text", ""))) for i, c in enumerate(cells) if c["cell_type"] == "code"
            for o in c.get("outputs", []) if o.get("output_type") == "stream"]


def notebooks():
    for kind in KINDS:
        for path in sorted((ROOT / kind / "zh").glob("*.ipynb")):
            name = f"{kind}/{path.stem}"
            if name not in SKIP:
                yield pytest.param(name, path, id=name)


def found_in(path) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for i, text in stored_text(path):
        for word in english_words(text):
            found.setdefault(word, []).append(i)
    return found


@pytest.mark.parametrize("name,path", list(notebooks()))
def test_zh_outputs_print_no_english(name, path):
    found = found_in(path)
    left = LEFT.get(name, set())
    new = {w: cells for w, cells in found.items() if w not in left}
    assert not new, f"{name}: English in the Chinese outputs (cells): {new}; print it through the catalogue"
    assert not left - set(found), f"{name}: no longer printed, remove from LEFT: {sorted(left - set(found))}"


@pytest.mark.parametrize("text,english", [
    ("   params: 计数得到 4 字节", ["params"]), ("运行      max |loss - DDP|", ["loss"]),
    ("{'stage': 4} -> 不存在 ZeRO stage 4", ["stage"]), ("column | none", ["column", "none"]),
    ("NCCL_DEBUG=INFO all_reduce dist.send `x y` 'a b' 2 GB/s", []),
])
def test_english_words_are_found(text, english):
    assert english_words(text) == english
