"""Several processes: process-group helpers (`dist`), FSDP2 sharding (`sharding`), metrics merged over processes
(`reduce`), memory accounting (`memory`) and results that do not depend on the process split or the CPU
(`determinism`)."""
