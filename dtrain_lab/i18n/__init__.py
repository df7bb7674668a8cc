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
    # --- compression (lesson 04) ----------------------------------------------------------
    "compression_bad_ratio": {
        "en": "ratio (the fraction of gradient entries top-k sends) must be a number in (0, 1], got {value!r}.",
        "zh": "ratio（top-k 发送的梯度元素比例）必须是 (0, 1] 区间内的数，收到的是 {value!r}。",
    },
    "compression_bad_k": {
        "en": "k must be an integer between 1 and the number of entries ({numel}), got {value!r}.",
        "zh": "k 必须是 1 到元素个数（{numel}）之间的整数，收到的是 {value!r}。",
    },
    "compression_bad_index_dtype": {
        "en": "index_dtype must be torch.int32 or torch.int64, got {value!r}.",
        "zh": "index_dtype 只能是 torch.int32 或 torch.int64，收到的是 {value!r}。",
    },
    "compression_bad_rank": {
        "en": "matrix_approximation_rank (PowerSGD's rank r) must be an integer ≥ 1, got {value!r}.",
        "zh": "matrix_approximation_rank（PowerSGD 的秩 r）必须是 ≥ 1 的整数，收到的是 {value!r}。",
    },
    "compression_bad_start_iter": {
        "en": "start_iter (steps of plain all-reduce before PowerSGD starts) must be an integer ≥ 0, got {value!r}.",
        "zh": "start_iter（PowerSGD 开始压缩之前先做普通 all-reduce 的步数）必须是 ≥ 0 的整数，收到的是 {value!r}。",
    },
    "compression_bad_method": {
        "en": "Unknown choice {value!r}. Choose one of: {choices}.",
        "zh": "未知的选项 {value!r}，请从以下选项中选择：{choices}。",
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
    """The message ``key`` in ``lang`` (default: the current language), formatted with ``fields``.

    A field that is itself a :class:`LabError` (e.g. the reason a checkpoint was skipped) is
    rendered in the same language, so each half of a bilingual message stays in one language.
    """
    lang = lang or _lang
    entry = MESSAGES[key]
    fields = {k: v.message(lang) if isinstance(v, LabError) else v for k, v in fields.items()}
    return entry[lang].format(**fields)


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

MESSAGES["cli_run_extra"] = {
    "en": "dtrain-lab run: unknown options {extra!r}. Options of your own program go after \"--\": "
          "dtrain-lab run train.py -n 2 -- {extra}",
    "zh": "dtrain-lab run：不认识的选项 {extra!r}。你自己程序的参数要写在 \"--\" 之后："
          "dtrain-lab run train.py -n 2 -- {extra}",
}

MESSAGES["unknown_exercise"] = {
    "en": "No exercise {id!r}. Known exercises: {known}.",
    "zh": "没有名为 {id!r} 的练习。现有练习：{known}。",
}

# --- hang / failure diagnosis (dtrain_lab.jobs.diagnose.diagnose) --------------------------------------
MESSAGES.update({
    "diag_startup": {
        "en": "The ranks never finished starting: a rank did not reach init_process_group, or the "
              "rendezvous address/port/network interface is wrong (lesson 11).",
        "zh": "各 rank 始终没能完成启动：可能有 rank 没有执行到 init_process_group，或者 rendezvous 的"
              "地址、端口、网卡配置有误（第 11 课）。",
    },
    "diag_rank_outside": {
        "en": "Rank(s) {ranks} are not in any collective while the others wait in one ({waiting}): "
              "look at what those ranks are doing (a stuck data loader, I/O, an endless loop, a rank-only branch).",
        "zh": "rank {ranks} 不在任何集合通信里，其他 rank 却在等（{waiting}）：先看这些 rank 在做什么"
              "（数据加载卡住、I/O、死循环、只在某个 rank 上执行的分支）。",
    },
    "diag_different_collectives": {
        "en": "The ranks wait in different collectives ({calls}): their programs took different paths "
              "(a collective under `if rank == ...`, different numbers of steps, a skipped iteration). "
              "TORCH_DISTRIBUTED_DEBUG=DETAIL turns this into an error that names both collectives.",
        "zh": "各 rank 停在不同的集合通信里（{calls}）：它们的程序走了不同的路径（集合通信写在 `if rank == ...` 里、"
              "步数不同、某次迭代被跳过）。设置 TORCH_DISTRIBUTED_DEBUG=DETAIL 可以把它变成一条点名两个集合通信的报错。",
    },
    "diag_uneven": {
        "en": "One rank is still in backward (DDP's gradient all-reduce) while another has moved on: "
              "uneven inputs. Give every rank the same number of batches (DistributedSampler) or use DDP's join().",
        "zh": "有 rank 还在 backward 里（DDP 的梯度 All-Reduce），另一个 rank 已经往下走了：这是输入不均衡。"
              "让每个 rank 的 batch 数相同（DistributedSampler），或者使用 DDP 的 join()。",
    },
    "diag_same_collective": {
        "en": "Every rank waits in the same collective ({call}): the program agrees, the transport does not "
              "deliver. Check the network (interfaces, firewall), a rank of another node, or a GPU that stopped.",
        "zh": "所有 rank 都停在同一个集合通信（{call}）里：程序本身是一致的，是数据没送到。"
              "检查网络（网卡、防火墙）、其他节点上的 rank，或者是否有 GPU 停止响应。",
    },
    "diag_desync_detected": {
        "en": "Desync detected: the ranks issued different collectives (the message names both). Find the "
              "branch or loop that differs between ranks.",
        "zh": "检测到不同步：各 rank 发起了不同的集合通信（报错里写明了双方）。去找各 rank 之间不一致的分支或循环。",
    },
    "diag_monitored_barrier": {
        "en": "monitored_barrier named the rank(s) that did not arrive: look at what they were doing.",
        "zh": "monitored_barrier 已经点名了没有到达的 rank：去看它们当时在做什么。",
    },
    "diag_unused_parameters": {
        "en": "DDP: some parameters got no gradient in the previous step. Use every output in the loss, "
              "or pass find_unused_parameters=True (slower: it walks the autograd graph every step); "
              "TORCH_DISTRIBUTED_DEBUG=INFO names the parameters.",
        "zh": "DDP：上一步里有参数没有得到梯度。让每个输出都参与 loss，或者传 find_unused_parameters=True"
              "（更慢：每一步都要遍历 autograd 图）；设置 TORCH_DISTRIBUTED_DEBUG=INFO 可以看到是哪些参数。",
    },
    "diag_address_in_use": {
        "en": "The rendezvous port is already taken (another job, or a previous one still exiting). Use "
              "--standalone on one machine, or another --master-port / --rdzv-endpoint port.",
        "zh": "rendezvous 端口已被占用（另一个作业，或上一个作业还没退干净）。单机用 --standalone，"
              "否则换一个 --master-port / --rdzv-endpoint 端口。",
    },
    "diag_size_mismatch": {
        "en": "Rank {rank} received more data than it expected: the ranks called the same collective with "
              "tensors of different sizes. TORCH_DISTRIBUTED_DEBUG=DETAIL names both shapes.",
        "zh": "rank {rank} 收到的数据比预期多：各 rank 用大小不同的张量调用了同一个集合通信。"
              "设置 TORCH_DISTRIBUTED_DEBUG=DETAIL 可以看到双方的形状。",
    },
    "diag_pg_timeout": {
        "en": "A collective timed out in rank {rank}: some rank did not join it within the process-group "
              "timeout. If the others were busy on purpose (a long evaluation on one rank), raise the timeout "
              "of init_process_group or let every rank share the work; otherwise look for a hang.",
        "zh": "rank {rank} 的一次集合通信超时了：有 rank 没能在进程组超时之内加入。如果其他 rank 是在忙正事"
              "（比如只在一个 rank 上做很长的评估），就调大 init_process_group 的 timeout，或者让每个 rank 分担；"
              "否则按挂起来排查。",
    },
    "diag_secondary": {
        "en": "Rank {rank}'s error only says its peer went away: the cause is in another rank's output "
              "(look for a rank that was killed, e.g. out of memory, with no Python traceback).",
        "zh": "rank {rank} 的报错只说明通信对端没了：真正的原因在另一个 rank 的输出里"
              "（找找被杀掉的 rank，比如内存不足，它往往没有 Python traceback）。",
    },
    "diag_first_failure": {
        "en": "Start from rank {rank}'s exception: the other ranks' errors are consequences.",
        "zh": "从 rank {rank} 的异常看起：其他 rank 的报错都是连带后果。",
    },
})

# --- ZeRO memory model / FSDP2 (dtrain_lab.perfmodel.zero_*, dtrain_lab.parallel.fsdp) -----------------
MESSAGES.update({
    "zero_bad_params": {
        "en": "num_params (the model's parameter count Ψ) must be a positive number, got {value!r}.",
        "zh": "num_params（模型参数量 Ψ）必须是正数，收到的是 {value!r}。",
    },
    "zero_bad_stage": {
        "en": "stage must be 0, 1, 2 or 3 (0 = plain data parallel, 3 = parameters sharded too), got {value!r}.",
        "zh": "stage 只能是 0、1、2 或 3（0 = 普通数据并行，3 = 连参数也切分），收到的是 {value!r}。",
    },
    "zero_bad_world": {
        "en": "world_size (the number of data-parallel ranks N) must be an integer ≥ 1, got {value!r}.",
        "zh": "world_size（数据并行的 rank 数 N）必须是 ≥ 1 的整数，收到的是 {value!r}。",
    },
    "zero_bad_precision": {
        "en": "precision must be one of {choices}, got {value!r}.",
        "zh": "precision 只能是 {choices} 之一，收到的是 {value!r}。",
    },
    "zero_bad_k": {
        "en": "k (optimizer-state bytes per parameter) must be a number ≥ 0, got {value!r}.",
        "zh": "k（每个参数的优化器状态字节数）必须是 ≥ 0 的数，收到的是 {value!r}。",
    },
    "zero_bad_bytes": {
        "en": "bytes_per_elem must be a positive number (2 for fp16/bf16, 4 for fp32), got {value!r}.",
        "zh": "bytes_per_elem 必须是正数（fp16/bf16 为 2，fp32 为 4），收到的是 {value!r}。",
    },
    "fsdp_bad_mp": {
        "en": "mixed_precision must be None, \"bf16\" or a torch MixedPrecisionPolicy, got {value!r}.",
        "zh": "mixed_precision 只能是 None、\"bf16\" 或 torch 的 MixedPrecisionPolicy，收到的是 {value!r}。",
    },
    "fsdp_no_units": {
        "en": "units must be submodules of the model; {name} is not one.",
        "zh": "units 必须是模型的子模块；{name} 不是。",
    },
    "fsdp_no_checkpoint": {
        "en": "No complete checkpoint at {path} (a folder left as {partial} is an interrupted save and is never loaded).",
        "zh": "{path} 处没有完整的检查点（名为 {partial} 的文件夹是中断了的保存，永远不会被加载）。",
    },
})

# --- zero (ZeRO stages 1-3, dtrain_lab/zero.py) --------------------------------------------
MESSAGES.update({
    "zero_opt_no_process_group": {
        "en": "A process_group was given but torch.distributed is not initialised. Start the program with "
              "torchrun (or dtrain_lab.launch), or leave process_group=None for a world of one.",
        "zh": "传入了 process_group，但 torch.distributed 尚未初始化。请用 torchrun（或 dtrain_lab.launch）启动程序，"
              "或者不传 process_group（单进程）。",
    },
    "zero_opt_bad_params": {
        "en": "{what} needs a non-empty list of parameter tensors (parameter groups as dicts are not supported).",
        "zh": "{what} 需要一个非空的参数张量列表（不支持以 dict 表示的参数组）。",
    },
    "zero_opt_shared_params": {
        "en": "The same parameter appears twice ({what}); tied/shared parameters cannot be sharded here.",
        "zh": "同一个参数出现了两次（{what}）；这里不能切分共享（绑定）的参数。",
    },
    "zero_opt_mixed_dtypes": {
        "en": "All parameters must have one dtype and one device to be laid out in one flat buffer; found {dtypes}.",
        "zh": "所有参数必须是同一种 dtype、在同一个设备上，才能排进同一个扁平缓冲区；实际看到 {dtypes}。",
    },
    "zero_opt_bad_stage": {
        "en": "ShardedOptimizer supports stage=1 or stage=2 (got {stage!r}); for stage 3 use ZeroStage3.",
        "zh": "ShardedOptimizer 只支持 stage=1 或 stage=2（收到 {stage!r}）；第 3 阶段请用 ZeroStage3。",
    },
    "zero_opt_no_closure": {
        "en": "step(closure) is not supported by the ZeRO optimizers here; call loss.backward() and then step().",
        "zh": "这里的 ZeRO 优化器不支持 step(closure)；请先 loss.backward()，再调用 step()。",
    },
    "zero_opt_state_mismatch": {
        "en": "This state dict belongs to (rank, world size) = {saved}, but this process is {now}.",
        "zh": "这个 state dict 属于 (rank, world size) = {saved}，而当前进程是 {now}。",
    },
    "zero_opt_bad_unit": {
        "en": "Each unit must be a submodule of the wrapped module (not the module itself); got {unit}.",
        "zh": "每个 unit 必须是被包装模块的子模块（不能是模块本身）；收到的是 {unit}。",
    },
    "zero_opt_backward_stage2": {
        "en": "reduce_in_backward=True needs stage=2: stage 1 keeps the full averaged gradient on every rank.",
        "zh": "reduce_in_backward=True 需要 stage=2：第 1 阶段要在每个 rank 上保留完整的平均梯度。",
    },
    "zero_opt_bad_bucket": {
        "en": "bucket_numel (elements per gradient bucket) must be an integer ≥ 1, got {value!r}.",
        "zh": "bucket_numel（每个梯度桶的元素个数）必须是 ≥ 1 的整数，收到的是 {value!r}。",
    },
    "zero_opt_bad_grad_reduce": {
        "en": "grad_reduce={value!r} is not valid for stage {stage}: stage 1 takes 'all_reduce' (default) or "
              "'reduce_scatter', stage 2 only 'reduce_scatter'.",
        "zh": "grad_reduce={value!r} 对第 {stage} 阶段无效：第 1 阶段可选 'all_reduce'（默认）或 'reduce_scatter'，"
              "第 2 阶段只能用 'reduce_scatter'。",
    },
    "zero_opt_unit_output": {
        "en": "Unit {unit} must return a tensor or a tuple of tensors that requires grad, so that ZeroStage3 "
              "can gather its parameters again in backward.",
        "zh": "unit {unit} 必须返回需要梯度的张量（或张量元组），ZeroStage3 才能在反向传播时重新收集它的参数。",
    },
})

# --- DeepSpeed (dtrain_lab.parallel.deepspeed_lab, lesson 06) ------------------------------------------
MESSAGES.update({
    "ds_bad_stage": {
        "en": "ZeRO stage {value!r} does not exist: choose 0 (plain data parallelism), 1 (optimizer state "
              "partitioned), 2 (+ gradients) or 3 (+ parameters).",
        "zh": "不存在 ZeRO stage {value!r}：只能是 0（普通数据并行）、1（切分优化器状态）、2（再切分梯度）"
              "或 3（再切分参数）。",
    },
    "ds_bad_positive_int": {
        "en": "{name}={value!r}: must be a whole number ≥ 1.",
        "zh": "{name}={value!r}：必须是 ≥ 1 的整数。",
    },
    "ds_bad_number": {
        "en": "{name}={value!r}: must be a number {rule}.",
        "zh": "{name}={value!r}：必须是 {rule} 的数。",
    },
    "ds_bad_choice": {
        "en": "{name}={value!r} is not supported. Choose one of: {choices}.",
        "zh": "不支持 {name}={value!r}，请从以下选项中选择：{choices}。",
    },
    "ds_batch_mismatch": {
        "en": "train_batch_size={train} does not equal micro batch × gradient accumulation × world size = "
              "{micro} × {accum} × {world} = {product}. DeepSpeed requires the equality exactly; change one of them.",
        "zh": "train_batch_size={train} 不等于 micro batch × 梯度累积步数 × world size = "
              "{micro} × {accum} × {world} = {product}。DeepSpeed 要求这个等式严格成立，请改其中一项。",
    },
    "ds_offload_needs_zero": {
        "en": "offload='cpu' needs ZeRO stage 1, 2 or 3 (got stage {stage}): DeepSpeed offloads the "
              "partitioned optimizer state, and stage 0 partitions nothing.",
        "zh": "offload='cpu' 需要 ZeRO stage 1、2 或 3（当前是 stage {stage}）：DeepSpeed 卸载的是切分后的"
              "优化器状态，而 stage 0 什么都不切分。",
    },
    "ds_no_fp16": {
        "en": "fp16 is not available on this machine: no CUDA GPU, and this CPU's oneDNN has no fp16 kernels "
              "(DeepSpeed's CPU accelerator asks torch.ops.mkldnn._is_mkldnn_fp16_supported()). Use bf16 or fp32.",
        "zh": "这台机器上用不了 fp16：没有 CUDA GPU，CPU 的 oneDNN 也没有 fp16 kernel（DeepSpeed 的 CPU 加速器"
              "用 torch.ops.mkldnn._is_mkldnn_fp16_supported() 判断）。请改用 bf16 或 fp32。",
    },
    "ds_no_fused_adam": {
        "en": "FusedAdam is not available on this machine: it is DeepSpeed's fused GPU kernel (CUDA, compiled on "
              "first use). On the CPU use optimizer='adam' (torch.optim.Adam).",
        "zh": "这台机器上用不了 FusedAdam：它是 DeepSpeed 为 GPU 写的融合 kernel（需要 CUDA，首次使用时编译）。"
              "在 CPU 上请用 optimizer='adam'（即 torch.optim.Adam）。",
    },
    "ds_why_cpu_adam": {
        "en": "DeepSpeed's CPU Adam (DeepSpeedCPUAdam) is a C++ op compiled with g++ on first use (minutes); "
              "it pays off when the optimizer is offloaded from GPUs that do the training",
        "zh": "DeepSpeed 的 CPU Adam（DeepSpeedCPUAdam）是 C++ 算子，首次使用时要用 g++ 现场编译（几分钟）；"
              "只有训练在 GPU 上、优化器卸载到 CPU 时才划算",
    },
    "ds_compiled_on_first_use": {
        "en": "compiled on first use",
        "zh": "首次使用时编译",
    },
    "ds_cpu_adam_needs_offload": {
        "en": "optimizer='cpu_adam' (DeepSpeedCPUAdam) runs the optimizer step on the CPU for an offloaded "
              "optimizer: use it with offload='cpu'.",
        "zh": "optimizer='cpu_adam'（DeepSpeedCPUAdam）是给卸载到 CPU 的优化器在 CPU 上做 step 用的，"
              "请配合 offload='cpu' 使用。",
    },
    "ds_offload_client_optimizer": {
        "en": "DeepSpeed refuses ZeRO-Offload with your own (client) optimizer unless the config says "
              "\"zero_force_ds_cpu_optimizer\": false (make_config(offload='cpu') writes it); or use DeepSpeedCPUAdam.",
        "zh": "DeepSpeed 默认不允许 ZeRO-Offload 搭配你自己传入的（client）优化器，除非配置里写明 "
              "\"zero_force_ds_cpu_optimizer\": false（make_config(offload='cpu') 会写上）；或者改用 DeepSpeedCPUAdam。",
    },
    "ds_op_build_failed": {
        "en": "DeepSpeed could not compile one of its C++/CUDA ops on this machine ({detail}). Run "
              "`python -m dtrain_lab.parallel.deepspeed_lab --probe` to see which ops need a compiler or a GPU.",
        "zh": "DeepSpeed 无法在这台机器上编译它的某个 C++/CUDA 算子（{detail}）。运行 "
              "`python -m dtrain_lab.parallel.deepspeed_lab --probe` 看哪些算子需要编译器或 GPU。",
    },
    "ds_rejected": {
        "en": "DeepSpeed rejects this config: {detail}",
        "zh": "DeepSpeed 拒绝了这份配置：{detail}",
    },
    "ds_pipeline_zero": {
        "en": "DeepSpeed's pipeline engine works with ZeRO stage 0 or 1 only (its own assertion: \"ZeRO-2 and "
              "ZeRO-3 are incompatible with pipeline parallelism\").",
        "zh": "DeepSpeed 的流水线引擎只支持 ZeRO stage 0 或 1（它自己的断言：\"ZeRO-2 and ZeRO-3 are incompatible "
              "with pipeline parallelism\"）。",
    },
})

# --- tensor / model parallelism (dtrain_lab.parallel.tensor, dtrain_lab.parallel.model) -------
MESSAGES.update({
    "tp_uneven": {
        "en": "Tensor parallelism splits {what} evenly: {n} is not divisible by the tensor-parallel size {tp}. "
              "Choose a size that divides {n} (or pad the layer to a multiple of {tp}).",
        "zh": "张量并行要把 {what} 平均切分：{n} 不能被张量并行规模 {tp} 整除。"
              "请换一个能整除 {n} 的规模（或把这一层补齐到 {tp} 的倍数）。",
    },
    "tp_uneven_heads": {
        "en": "Attention is split by heads: {heads} heads cannot be shared evenly by {tp} ranks. "
              "The tensor-parallel size must divide the number of heads.",
        "zh": "注意力按头（head）切分：{heads} 个头没法平均分给 {tp} 个 rank。张量并行规模必须能整除头数。",
    },
    "tp_bad_rank": {
        "en": "rank {rank} is not in a tensor-parallel group of size {tp} (valid: 0 … tp-1, tp ≥ 1).",
        "zh": "rank {rank} 不在规模为 {tp} 的张量并行组里（合法取值：0 … tp-1，且 tp ≥ 1）。",
    },
    "mp_not_sequential": {
        "en": "Model parallelism here cuts an nn.Sequential (or a model with a `layers` Sequential, like "
              "dtrain_lab.models.MLP) into consecutive parts; got {kind}.",
        "zh": "这里的模型并行把 nn.Sequential（或带 `layers` 这个 Sequential 的模型，如 dtrain_lab.models.MLP）"
              "切成连续的几段；传入的却是 {kind}。",
    },
    "mp_bad_parts": {
        "en": "Cannot cut the model into {parts} parts: it has {linears} Linear layers and every part needs at "
              "least one. Use between 1 and {linears} ranks.",
        "zh": "没法把模型切成 {parts} 段：它只有 {linears} 个 Linear 层，而每段至少要一个。"
              "rank 数请设在 1 到 {linears} 之间。",
    },
    "mp_missing_gpu": {
        "en": "The devices ask for {need} GPUs but this machine has {have}. Pass devices that exist "
              "(e.g. ['cpu', 'cpu'] to try the code on the CPU).",
        "zh": "devices 需要 {need} 块 GPU，这台机器只有 {have} 块。请传入实际存在的设备"
              "（例如 ['cpu', 'cpu']，在 CPU 上试这段代码）。",
    },
})

# --- pipeline parallel (dtrain_lab.parallel.pipeline) and parallel dimensions (dtrain_lab.parallel.dims) ----
MESSAGES.update({
    "pp_bad_int": {
        "en": "{name} must be an integer ≥ {minimum}, got {value!r}.",
        "zh": "{name} 必须是 ≥ {minimum} 的整数，收到的是 {value!r}。",
    },
    "pp_bad_kind": {
        "en": "Unknown pipeline schedule {value!r}. Choose one of: {choices}.",
        "zh": "未知的流水线调度 {value!r}，请从以下选项中选择：{choices}。",
    },
    "pp_wrong_stage_count": {
        "en": "The schedule has {got} stage lists, but the pipeline has {p} stages.",
        "zh": "调度里有 {got} 个阶段的动作列表，但流水线有 {p} 个阶段。",
    },
    "pp_bad_action": {
        "en": "stage {stage}, position {pos}: {action!r} is not an action (kind 'F' or 'B', micro-batch 0 … m-1).",
        "zh": "阶段 {stage} 第 {pos} 个动作 {action!r} 无效（类型须为 'F' 或 'B'，微批次编号须在 0 … m-1 之间）。",
    },
    "pp_duplicate": {
        "en": "stage {stage} runs {action} twice.",
        "zh": "阶段 {stage} 把 {action} 执行了两次。",
    },
    "pp_b_before_f": {
        "en": "stage {stage} runs B{mb} before F{mb}: a backward needs the activations of its forward.",
        "zh": "阶段 {stage} 在 F{mb} 之前执行了 B{mb}：反向传播需要对应前向传播保存的激活。",
    },
    "pp_missing": {
        "en": "stage {stage} never runs {action}.",
        "zh": "阶段 {stage} 从未执行 {action}。",
    },
    "pp_act": {"en": "activation", "zh": "激活"},
    "pp_grad": {"en": "gradient", "zh": "梯度"},
    "pp_wait_recv": {
        "en": "stage {stage} waits in {action} to receive the {what} from stage {peer}",
        "zh": "阶段 {stage} 在 {action} 中等待接收阶段 {peer} 的{what}",
    },
    "pp_wait_send": {
        "en": "stage {stage} waits in {action} to send the {what} to stage {peer}",
        "zh": "阶段 {stage} 在 {action} 中等待把{what}发送给阶段 {peer}",
    },
    "pp_deadlock": {
        "en": "Deadlock: no stage can move. {waits}.",
        "zh": "死锁：所有阶段都无法继续。{waits}。",
    },
    "pp_order": {
        "en": "Out of order: stage {stage} expects the {what} of micro-batch {expected} from stage {src}, "
              "but the next message on that link is micro-batch {got} (send/recv match by order).",
        "zh": "顺序错乱：阶段 {stage} 等待阶段 {src} 发来微批次 {expected} 的数据（{what}），"
              "但这条链路上的下一条消息属于微批次 {got}（send/recv 按先后顺序配对）。",
    },
    "pp_invalid": {
        "en": "This pipeline schedule cannot run:\n  {problems}",
        "zh": "这个流水线调度无法运行：\n  {problems}",
    },
    "pp_bad_times": {
        "en": "{name} must be a non-negative number or one per stage ({p} values), got {value!r}.",
        "zh": "{name} 必须是非负数，或每个阶段一个值（共 {p} 个），收到的是 {value!r}。",
    },
    "pp_not_sequential": {
        "en": "split_sequential needs an nn.Sequential (or a model with a .layers Sequential), got {type}.",
        "zh": "split_sequential 需要 nn.Sequential（或带 .layers 这个 Sequential 的模型），收到的是 {type}。",
    },
    "pp_too_few_layers": {
        "en": "Cannot cut {layers} layers with parameters into {p} stages: each stage needs at least one.",
        "zh": "{layers} 个带参数的层无法切成 {p} 个阶段：每个阶段至少要有一层。",
    },
    "pp_bad_stage_index": {
        "en": "stage_index must be in 0 … {p}-1, got {index!r}.",
        "zh": "stage_index 必须在 0 … {p}-1 之间，收到的是 {index!r}。",
    },
    "pp_no_group": {
        "en": "A pipeline of {p} stages needs an initialised process group (one rank per stage); "
              "start the program with torchrun or dtrain_lab.jobs.launch.",
        "zh": "{p} 个阶段的流水线需要已初始化的进程组（每个阶段一个 rank）；请用 torchrun 或 dtrain_lab.launch 启动程序。",
    },
    "pp_group_mismatch": {
        "en": "Stage {index} of {p} must run on rank {index} of a group of {p} ranks; this process is rank "
              "{rank} of {size}.",
        "zh": "{p} 个阶段中的阶段 {index} 必须运行在 {p} 个 rank 的进程组中的 rank {index} 上；"
              "当前进程是 {size} 个 rank 中的 rank {rank}。",
    },
    "pp_bad_activation": {
        "en": "A stage output must be one tensor of at most 8 dimensions in float32/16, bfloat16 or float64; "
              "got shape {shape}, {dtype}.",
        "zh": "阶段的输出必须是一个不超过 8 维、类型为 float32/16、bfloat16 或 float64 的张量；"
              "收到的形状为 {shape}，类型为 {dtype}。",
    },
    "pp_need_inputs": {
        "en": "Stage {stage} needs {what}: a list of {m} tensors (one per micro-batch), got {got!r}.",
        "zh": "阶段 {stage} 需要 {what}：{m} 个张量组成的列表（每个微批次一个），收到的是 {got!r}。",
    },
    "dims_bad_factor": {
        "en": "ParallelDims: {name} must be an integer ≥ 1, got {value!r}.",
        "zh": "ParallelDims：{name} 必须是 ≥ 1 的整数，收到的是 {value!r}。",
    },
    "dims_product": {
        "en": "ParallelDims: dp × tp × pp = {dp} × {tp} × {pp} = {product}, but world_size = {world}. "
              "The three degrees must multiply to the number of ranks.",
        "zh": "ParallelDims：dp × tp × pp = {dp} × {tp} × {pp} = {product}，但 world_size = {world}。"
              "三个并行度的乘积必须等于 rank 总数。",
    },
    "dims_world_mismatch": {
        "en": "ParallelDims says world_size = {expected}, but the process group has {actual} ranks.",
        "zh": "ParallelDims 写的 world_size = {expected}，但进程组实际有 {actual} 个 rank。",
    },
})

# --- recovery: checkpoints, resume, fault injection, heartbeats (dtrain_lab.resilience.recovery) ----------
MESSAGES.update({
    "rec_bad_step": {
        "en": "step must be an integer >= 0, got {value!r}.",
        "zh": "step 必须是 >= 0 的整数，收到的是 {value!r}。",
    },
    "rec_bad_keep": {
        "en": "keep must be an integer >= 1 (or None to keep every checkpoint), got {value!r}.",
        "zh": "keep 必须是 >= 1 的整数（None 表示全部保留），收到的是 {value!r}。",
    },
    "rec_bad_state": {
        "en": "A checkpoint state must be a dict (e.g. what recovery.capture() returns), not {type}.",
        "zh": "检查点的状态必须是 dict（例如 recovery.capture() 的返回值），不能是 {type}。",
    },
    "rec_unreadable": {
        "en": "Cannot read checkpoint {path}: {detail}",
        "zh": "无法读取检查点 {path}：{detail}",
    },
    "rec_truncated": {
        "en": "Checkpoint {path} is truncated ({size} bytes): its write was interrupted.",
        "zh": "检查点 {path} 不完整（只有 {size} 字节）：写入过程被中断了。",
    },
    "rec_no_footer": {
        "en": "Checkpoint {path} has no commit footer: it is incomplete or was not written by recovery.save().",
        "zh": "检查点 {path} 没有提交标记（文件尾）：文件不完整，或者不是 recovery.save() 写的。",
    },
    "rec_checksum": {
        "en": "Checkpoint file {path} fails its SHA-256 check: it is corrupted.",
        "zh": "检查点文件 {path} 的 SHA-256 校验失败：文件已损坏。",
    },
    "rec_skip_bad": {
        "en": "Skipping checkpoint {path} ({reason}); falling back to the previous one.",
        "zh": "跳过检查点 {path}（{reason}），改用上一个检查点。",
    },
    "rec_dcp_uncommitted": {
        "en": "{path} is not a committed DCP checkpoint (no valid COMMIT file): its save did not finish.",
        "zh": "{path} 不是已提交的 DCP 检查点（没有有效的 COMMIT 文件）：保存没有完成。",
    },
    "rec_dcp_file": {
        "en": "Checkpoint file {path} is missing or has the wrong size.",
        "zh": "检查点文件 {path} 缺失或大小不对。",
    },
    "rec_bad_position": {
        "en": "Data position index {index} is outside 0 … {n} (samples per rank in an epoch).",
        "zh": "数据位置 index={index} 超出范围 0 … {n}（每个 rank 每个 epoch 的样本数）。",
    },
    "rec_bad_position_type": {
        "en": "A data position must be a DataPosition, a dict with 'epoch' and 'index', or a "
              "ResumableDistributedSampler, not {type}.",
        "zh": "数据位置必须是 DataPosition、含 'epoch' 和 'index' 的 dict，或 ResumableDistributedSampler，不能是 {type}。",
    },
    "rec_not_train_state": {
        "en": "This is not a training state made by recovery.capture() (no 'model' / 'step').",
        "zh": "这不是 recovery.capture() 生成的训练状态（缺少 'model' / 'step'）。",
    },
    "rec_missing_part": {
        "en": "The checkpoint has no {part} state, but a {part} was given to restore().",
        "zh": "检查点里没有 {part} 的状态，但 restore() 收到了一个 {part}。",
    },
    "rec_world_changed": {
        "en": "The checkpoint holds RNG states of {saved} ranks, the job now has {now}: training continues, "
              "but not bit-identically to an uninterrupted run.",
        "zh": "检查点保存了 {saved} 个 rank 的随机数状态，而现在有 {now} 个 rank：训练可以继续，"
              "但结果不会与不中断的训练逐位相同。",
    },
    "rec_bad_fail_env": {
        "en": "Fault-injection variables must be numbers: {detail}",
        "zh": "故障注入的环境变量必须是数字：{detail}",
    },
    "rec_bad_fail_mode": {
        "en": "DTRAIN_FAIL_MODE={value!r} is unknown. Choose one of: {choices}.",
        "zh": "DTRAIN_FAIL_MODE={value!r} 未知，请从以下选项中选择：{choices}。",
    },
    "rec_injected": {
        "en": "[fault injection] mode {mode}: rank {rank} fails at step {step} ({where})",
        "zh": "[故障注入] 模式 {mode}：rank {rank} 在第 {step} 步失败（{where}）",
    },
    "rec_stalled": {
        "en": "watchdog: rank {rank} has sent no heartbeat for {age:.1f} s (last step {step}).",
        "zh": "看门狗：rank {rank} 已有 {age:.1f} 秒没有心跳（最后一步：{step}）。",
    },
})

# --- multi-node jobs (dtrain_lab.jobs.cluster) and mixed GPUs (dtrain_lab.parallel.hetero) ------------------
MESSAGES.update({
    "cl_nodes_ok": {
        "en": "✓ {nnodes} nodes, {world} ranks in all, rendezvous at {endpoint}: every node finished (exit code 0)",
        "zh": "✓ {nnodes} 个节点、共 {world} 个 rank，rendezvous 地址 {endpoint}：所有节点正常结束（退出码 0）",
    },
    "cl_nodes_failed": {
        "en": "✗ the {nnodes}-node job ({world} ranks, rendezvous at {endpoint}) failed",
        "zh": "✗ {nnodes} 节点作业（共 {world} 个 rank，rendezvous 地址 {endpoint}）失败",
    },
    "cl_node_line": {
        "en": "  node {node} (started with node_rank={node}) -> group rank {group} from the rendezvous, global ranks {ranks}",
        "zh": "  节点 {node}（启动时 node_rank={node}）-> rendezvous 分配的组 rank 为 {group}，全局 rank {ranks}",
    },
    "cl_node_stopped": {
        "en": "  node {node} was stopped because another node had failed (or the overall time limit ran out)",
        "zh": "  节点 {node} 因另一个节点失败（或总时限已到）而被终止",
    },
    "cl_bad_int": {
        "en": "{field} must be an integer ≥ {lo}, got {value!r}.",
        "zh": "{field} 必须是 ≥ {lo} 的整数，收到的是 {value!r}。",
    },
    "cl_bad_range": {
        "en": "{field} must be an integer from {lo} to {hi}, got {value!r}.",
        "zh": "{field} 必须是 {lo} 到 {hi} 之间的整数，收到的是 {value!r}。",
    },
    "cl_bad_name": {
        "en": "{value!r} is not a valid name: lower-case letters, digits and '-', starting with a letter, "
              "not ending with '-', at most 40 characters (it becomes pod and host names).",
        "zh": "{value!r} 不是合法的名字：只能用小写字母、数字和“-”，以字母开头、不以“-”结尾，最长 40 个字符"
              "（它会成为 Pod 名和主机名的一部分）。",
    },
    "cl_nproc_gpus": {
        "en": "nproc_per_node={nproc} but gpus_per_node={gpus}: a GPU job runs one process per GPU.",
        "zh": "nproc_per_node={nproc}，gpus_per_node={gpus}：GPU 作业每块 GPU 一个进程，两者必须相等。",
    },
    "cl_program": {
        "en": "Give exactly one of module= (python -m …) and script= (a .py path); got module={module!r}, script={script!r}.",
        "zh": "module=（python -m …）和 script=（.py 路径）必须且只能给一个；收到 module={module!r}，script={script!r}。",
    },
    "cl_bad_module": {
        "en": "{value!r} is not a module name (a.b.c) or a script path.",
        "zh": "{value!r} 不是模块名（形如 a.b.c），也不是脚本路径。",
    },
    "cl_bad_quantity": {
        "en": "{field}={value!r} is not a size like '32Gi' or '512Mi' (a positive integer followed by Mi, Gi or Ti).",
        "zh": "{field}={value!r} 不是形如 '32Gi'、'512Mi' 的大小（正整数后跟 Mi、Gi 或 Ti）。",
    },
    "cl_shm_memory": {
        "en": "shm_size={shm} is not smaller than memory={memory}: /dev/shm is RAM and counts against the memory limit.",
        "zh": "shm_size={shm} 不小于 memory={memory}：/dev/shm 占用的是内存，计入内存上限。",
    },
    "cl_bad_time": {
        "en": "time_limit={value!r} is not a duration like '02:00:00' or '1-12:00:00' ([days-]hours:minutes:seconds).",
        "zh": "time_limit={value!r} 不是形如 '02:00:00' 或 '1-12:00:00' 的时长（[天-]时:分:秒）。",
    },
    "cl_bad_image": {
        "en": "image={value!r} is not a container image name.",
        "zh": "image={value!r} 不是合法的容器镜像名。",
    },
    "cl_need_image": {
        "en": "Job {name!r}: Kubernetes needs a container image (image=…, --image).",
        "zh": "作业 {name!r}：Kubernetes 需要一个容器镜像（image=…，--image）。",
    },
    "cl_env_name": {
        "en": "{name!r} is not a valid environment variable (KEY=VALUE, KEY of letters, digits and _).",
        "zh": "{name!r} 不是合法的环境变量（KEY=VALUE，KEY 只能由字母、数字和下划线组成）。",
    },
    "cl_env_reserved": {
        "en": "{name} is set by torchrun, SLURM or the operator for every process; do not set it in env.",
        "zh": "{name} 由 torchrun、SLURM 或 operator 为每个进程设置，不要在 env 里设置它。",
    },
    "cl_env_lint": {  # the linter's finding in each language; "{x:.0}" prints nothing (same fields in both)
        "en": "env {name}={value!r}: {en}{zh:.0}",
        "zh": "环境变量 {name}={value!r}：{zh}{en:.0}",
    },
    "cl_bad_format": {
        "en": "Unknown output {value!r}. Choose one of: {choices}.",
        "zh": "未知的输出格式 {value!r}，请从以下选项中选择：{choices}。",
    },
    "cl_written": {
        "en": "wrote {path} ({fmt})",
        "zh": "已写入 {path}（{fmt}）",
    },
    "het_bad_global": {
        "en": "global_batch must be a positive integer, got {value!r}.",
        "zh": "global_batch 必须是正整数，收到的是 {value!r}。",
    },
    "het_no_ranks": {
        "en": "Give one throughput (or one memory limit) per rank: got none.",
        "zh": "需要为每个 rank 给出一个吞吐量（或一个显存上限）：一个也没有收到。",
    },
    "het_bad_value": {
        "en": "{what}[{rank}]={value!r} must be a positive number.",
        "zh": "{what}[{rank}]={value!r} 必须是正数。",
    },
    "het_lengths": {
        "en": "throughputs has {n} ranks but max_micro has {m}: give one value per rank.",
        "zh": "throughputs 有 {n} 个 rank，max_micro 却有 {m} 个：每个 rank 各给一个值。",
    },
    "het_too_small": {
        "en": "global_batch={value} is smaller than the number of ranks ({n}): every rank needs at least one sample.",
        "zh": "global_batch={value} 小于 rank 数（{n}）：每个 rank 至少要分到一个样本。",
    },
    "het_table_head": {
        "en": "rank  samples  micro×accum  share   est. s",
        "zh": "rank   样本数  micro×累积    占比   估计秒数",
    },
    "het_table_foot": {
        "en": "step time (slowest rank): planned split {planned:.3g} s | even split {even:.3g} s ({ratio:.2f}×)",
        "zh": "每步耗时（由最慢的 rank 决定）：按吞吐量切分 {planned:.3g} s | 平均切分 {even:.3g} s（{ratio:.2f}×）",
    },
    "het_bad_counts": {
        "en": "Sample counts must be integers ≥ 0 with a positive total, got {value!r}.",
        "zh": "样本数必须是 ≥ 0 的整数且总数为正，收到的是 {value!r}。",
    },
})

MESSAGES.update({
    "mon_step_open": {
        "en": "StepTimer.start_step() called while a step is still open: call end_step() first.",
        "zh": "上一步还没结束就调用了 StepTimer.start_step()：请先调用 end_step()。",
    },
    "mon_step_not_open": {
        "en": "StepTimer.end_step() called without start_step().",
        "zh": "没有先调用 start_step() 就调用了 StepTimer.end_step()。",
    },
    "mon_no_step": {
        "en": "timer.phase({name!r}) used outside a step: call timer.start_step() first.",
        "zh": "timer.phase({name!r}) 用在了一步之外：请先调用 timer.start_step()。",
    },
    "mon_phase_open": {
        "en": "end_step() called while phase {name!r} is still open.",
        "zh": "阶段 {name!r} 还没结束就调用了 end_step()。",
    },
    "mon_no_steps": {
        "en": "No steps to summarise: {n} recorded, skip={skip}.",
        "zh": "没有可汇总的步：共记录了 {n} 步，skip={skip}。",
    },
    "mon_bad_steps": {
        "en": "profile_step needs steps ≥ 1 and warmup ≥ 0, got steps={steps}, warmup={warmup}.",
        "zh": "profile_step 要求 steps ≥ 1、warmup ≥ 0，收到的是 steps={steps}、warmup={warmup}。",
    },
    "mon_no_trace": {
        "en": "No trace file at {path}: run profile_step first.",
        "zh": "{path} 处没有 trace 文件：请先运行 profile_step。",
    },
    "mon_table_title": {
        "en": "mean time per step, per rank:",
        "zh": "各 rank 每步的平均耗时：",
    },
    "mon_straggler": {
        "en": "straggler: rank {rank} (busy {busy:.2f} ms/step); rank {fast} is busy {fast_busy:.2f} ms/step "
              "and waits {wait:.2f} ms/step longer inside the collectives",
        "zh": "掉队者：rank {rank}（每步忙 {busy:.2f} ms）；rank {fast} 每步只忙 {fast_busy:.2f} ms，"
              "在集合通信里每步多等 {wait:.2f} ms",
    },
    "mon_split": {
        "en": "step {step:.2f} ms = {parts}; {sps:.1f} samples/s [{clock}]",
        "zh": "每步 {step:.2f} ms = {parts}；{sps:.1f} 样本/s [{clock}]",
    },
})
