"""The CUDA tier's engine recipe (:mod:`.recipe`): the same engine as the CPU
tier with the production GPU paths on."""
