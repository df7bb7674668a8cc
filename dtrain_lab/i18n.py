"""zh/en message catalogue for every message a learner sees.

The language is chosen once, in a notebook's setup cell (``set_lang("zh")``) or by the
``DTRAIN_LANG`` environment variable; it is inherited by every rank a launch starts, so messages
printed from inside a job speak the learner's language too. ``tr(key, **fields)`` formats one
message; ``MESSAGES`` holds every key in both languages (a test checks none is missing).
"""
from __future__ import annotations

import locale
import os

LANGS = ("zh", "en")

MESSAGES: dict[str, dict[str, str]] = {
    # --- runtime -------------------------------------------------------------------------
    "bad_backend": {
        "en": "DTRAIN_BACKEND={value!r} is not a backend this machine can use. Choose one of: {choices}.",
        "zh": "DTRAIN_BACKEND={value!r} 不是本机可用的后端，请从以下选项中选择：{choices}。",
    },
    "nccl_without_gpu": {
        "en": "The nccl backend needs one CUDA GPU per local rank ({local_world} ranks, {gpus} GPUs "
              "visible). Use gloo on this machine (unset DTRAIN_BACKEND).",
        "zh": "nccl 后端要求每个本地 rank 独占一块 CUDA GPU（本机 {local_world} 个 rank，只看到 {gpus} 块 GPU）。"
              "这台机器请用 gloo（去掉 DTRAIN_BACKEND 即可）。",
    },
    "bad_env_int": {
        "en": "Environment variable {name}={value!r} must be an integer ({hint}).",
        "zh": "环境变量 {name}={value!r} 必须是整数（{hint}）。",
    },
    "bad_env_float": {
        "en": "Environment variable {name}={value!r} must be a positive number of seconds.",
        "zh": "环境变量 {name}={value!r} 必须是正数（单位：秒）。",
    },
    "partial_torchrun_env": {
        "en": "Found {present} but not {missing}: this looks like a half-set torchrun environment. "
              "Start the program with torchrun (or dtrain_lab.launch), or unset these variables.",
        "zh": "环境里有 {present}，却没有 {missing}：torchrun 的环境变量只设了一半。"
              "请用 torchrun（或 dtrain_lab.launch）启动程序，或者删掉这些变量。",
    },
    "bad_debug_level": {
        "en": "TORCH_DISTRIBUTED_DEBUG={value!r} is not valid; use OFF, INFO or DETAIL.",
        "zh": "TORCH_DISTRIBUTED_DEBUG={value!r} 无效，只能是 OFF、INFO 或 DETAIL。",
    },
    # --- launch --------------------------------------------------------------------------
    "launch_start": {
        "en": "launching {target} on {nproc} processes ({backend})",
        "zh": "启动 {target}：{nproc} 个进程（{backend}）",
    },
    "launch_ok": {
        "en": "✓ all {nproc} ranks finished (exit code 0)",
        "zh": "✓ {nproc} 个 rank 全部正常结束（退出码 0）",
    },
    "launch_failed": {
        "en": "✗ the job failed (exit code {code}); first failing rank: {rank}",
        "zh": "✗ 作业失败（退出码 {code}）；最先出错的 rank：{rank}",
    },
    "launch_exception": {
        "en": "  rank {rank} raised {exc}",
        "zh": "  rank {rank} 抛出异常 {exc}",
    },
    "launch_hung": {
        "en": "✗ HUNG: no progress within the {limit:g} s limit after start-up; every process of the job was killed.",
        "zh": "✗ 挂起：启动完成后 {limit:g} 秒的时限内没有结束；作业的所有进程已被终止。",
    },
    "launch_hung_startup": {
        "en": "✗ HUNG during start-up: no rank finished init_process_group within {limit:g} s "
              "(is one rank not calling it, or a firewall blocking the rendezvous?); every process was killed.",
        "zh": "✗ 启动阶段挂起：{limit:g} 秒内没有任何 rank 完成 init_process_group"
              "（是不是有 rank 没调用它，或防火墙挡住了 rendezvous？）；所有进程已被终止。",
    },
    "launch_interrupted": {
        "en": "✗ interrupted: every process of the job was killed.",
        "zh": "✗ 已中断：作业的所有进程已被终止。",
    },
    "where_waiting": {
        "en": "  rank {rank} is waiting in {call}  ({where})",
        "zh": "  rank {rank} 卡在 {call}  （{where}）",
    },
    "where_unknown": {
        "en": "  rank {rank}: no stack could be read (the process had already exited or blocks signals)",
        "zh": "  rank {rank}：读不到调用栈（进程已退出或屏蔽了信号）",
    },
    "where_hint": {
        "en": "  Ranks waiting in different collectives (or one rank elsewhere) is the signature of a deadlock.",
        "zh": "  各 rank 卡在不同的集合通信里（或有 rank 根本不在通信里），这正是死锁的特征。",
    },
    "output_truncated": {
        "en": "[rank {rank}] … output truncated after {n} lines (the full log is in {path})",
        "zh": "[rank {rank}] … 输出超过 {n} 行，已截断（完整日志见 {path}）",
    },
    "bad_nproc": {
        "en": "nproc must be a positive integer, got {value!r}.",
        "zh": "nproc 必须是正整数，收到的是 {value!r}。",
    },
    "bad_timeout": {
        "en": "{name} must be a positive number of seconds, got {value!r}.",
        "zh": "{name} 必须是正数（单位：秒），收到的是 {value!r}。",
    },
    "bad_target": {
        "en": "Cannot launch {target!r}: it is neither an existing .py file nor an importable module.",
        "zh": "无法启动 {target!r}：它既不是存在的 .py 文件，也不是可导入的模块。",
    },
    "nnodes_args": {
        "en": "A multi-node launch needs rdzv_endpoint (host:port of node 0) and node_rank between 0 and nnodes-1.",
        "zh": "多节点启动需要 rdzv_endpoint（0 号节点的 host:port），且 node_rank 在 0 到 nnodes-1 之间。",
    },
    # --- viz -----------------------------------------------------------------------------
    "no_cjk_font": {
        "en": "No CJK font found; plots fall back to English labels. Install one "
              "(Debian/Ubuntu: apt install fonts-noto-cjk) to see Chinese labels.",
        "zh": "没有找到中文字体，图中标签改用英文。安装一个中文字体（Debian/Ubuntu：apt install fonts-noto-cjk）即可显示中文。",
    },
    # --- grading / generic ---------------------------------------------------------------
    "not_in_torchrun": {
        "en": "This program must run under torchrun with at least {need} processes (world size now {have}).",
        "zh": "这个程序需要在 torchrun 下以至少 {need} 个进程运行（当前 world size 为 {have}）。",
    },
}


def _default_lang() -> str:
    env = os.environ.get("DTRAIN_LANG", "").strip().lower()
    if env in LANGS:
        return env
    try:
        loc = (locale.getlocale()[0] or os.environ.get("LANG", "")).lower()
    except ValueError:  # pragma: no cover - exotic locales
        loc = os.environ.get("LANG", "").lower()
    return "zh" if loc.startswith("zh") else "en"


_lang = _default_lang()


def set_lang(lang: str) -> str:
    """Select the learner's language ("zh" or "en") for this process and every job it launches."""
    global _lang
    lang = str(lang).strip().lower()
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS} / 语言只能是 {LANGS}: {lang!r}")
    _lang = lang
    os.environ["DTRAIN_LANG"] = lang  # launched ranks inherit it
    return lang


def get_lang() -> str:
    return _lang


def tr(key: str, lang: str | None = None, **fields) -> str:
    """The message ``key`` in ``lang`` (default: the current language), formatted with ``fields``."""
    entry = MESSAGES[key]
    return entry[lang or _lang].format(**fields)


def both(key: str, **fields) -> str:
    """The message in both languages, the learner's first: for errors raised in library code."""
    first = _lang
    second = "en" if first == "zh" else "zh"
    return f"{tr(key, first, **fields)}\n{tr(key, second, **fields)}"


class LabError(ValueError):
    """A learner-facing error: its message is bilingual, learner's language first; no traceback wall
    is needed to understand it."""

    def __init__(self, key: str, **fields):
        self.key = key
        self.fields = fields
        super().__init__(both(key, **fields))

    def message(self, lang: str | None = None) -> str:
        return tr(self.key, lang, **self.fields)

MESSAGES["unknown_exercise"] = {
    "en": "No exercise {id!r}. Known exercises: {known}.",
    "zh": "没有名为 {id!r} 的练习。现有练习：{known}。",
}
