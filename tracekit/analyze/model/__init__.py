"""The model of a trace: GPU operations (:mod:`.gpu_ops`), NVTX ranges (:mod:`.nvtx`), phases,
sub-phases and iterations (:mod:`.phases`), interval algebra (:mod:`.intervals`), rank and pid
identities (:mod:`.rank_ids`) and communication kernels (:mod:`.communication`)."""
