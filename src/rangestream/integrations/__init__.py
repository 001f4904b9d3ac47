"""Glue for training frameworks (transformers, accelerate, Lightning), each module importing
its framework only when used, so the base install stays light (`pip install rangestream[integrations]`)."""
