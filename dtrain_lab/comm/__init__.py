"""See dtrain_lab/__init__.py for the layers."""
