"""The lessons' experiments: code that trains, times, measures or launches, kept out of the technique
layer (``comm``, ``parallel``, ``resilience``, ``nccl``).

Most modules are programs that lessons launch with torchrun (``dtrain_lab.launch("dtrain_lab.demos.<name>")``):
a module, because torchrun cannot run code defined in a notebook; short; ending with
``runtime.entrypoint(main)`` (``recovery_restart_probe`` starts its own process group instead: it
shows what a restart meets). The others are drivers a lesson calls in its own process (``amp_runs``,
``actckpt_measure``, ``recovery_lesson``, ``busy_port``) and pieces the
programs share (``alternate``, ``commcount``, ``zero_cases``, ``dp_sync_bn``, ``ds_train``).
"""
