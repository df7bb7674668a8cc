"""Programs that lessons launch with torchrun: ``dtrain_lab.launch("dtrain_lab.demos.<name>")``.

Each is a module (torchrun cannot run code defined in a notebook), short, and ends with
``runtime.entrypoint(main)``.
"""
