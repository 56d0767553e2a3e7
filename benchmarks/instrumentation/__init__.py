"""Opt-in instrumentation of SGLang servers, outside the plugin's serving path: the per-stage timer of DFlash-family
decode steps (`stage_timer`, LILICORR_STAGE_TIMING=DIR) and the record of the first block each rank proposes
(`proposal_record`, LILICORR_PROPOSAL_RECORD=DIR). SGLang loads them through the lab's own plugin,
`lilicorr_instrumentation` (`plugin.register`; its entry point: entry_point/, put on PYTHONPATH by
`benchmarks.lab_env`), which installs nothing unless one of the two variables is set."""
