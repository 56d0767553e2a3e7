"""Opt-in instrumentation of SGLang servers, outside the plugin's serving path: the per-stage timer of DFlash-family
decode steps (`stage_timer`, LILICORR_STAGE_TIMING=DIR) and the record of the first block each rank proposes
(`proposal_record`, LILICORR_PROPOSAL_RECORD=DIR). SGLang loads them through their own plugin entry point,
`lilicorr_instrumentation` (`plugin.register`), which installs nothing unless one of the two variables is set."""
