"""A reply the target did not end (regenerate's last turn cut at its cap or at a loop) trains on its content only:
the end-of-turn the chat template adds after it is not the target's and gets no loss."""

import json

from sglang_lilicorr.train.data import load_conversations, tokenize_conversation

MESSAGES = [{"role": "user", "content": "the cat"}, {"role": "assistant", "content": "a dog ran far"}]


def test_a_cut_last_turn_is_supervised_up_to_its_content(tmp_path):
    from test_train import make_tokenizer

    tok = make_tokenizer()
    ids, whole = tokenize_conversation(tok, MESSAGES, {}, "row")
    _, cut = tokenize_conversation(tok, MESSAGES, {}, "row", cut=True)
    assert ids[-1] == tok.eos_token_id and whole[-1] and not cut[-1]  # the end-of-turn: supervised only when ended
    assert cut[:-1] == whole[:-1]
    ended_or_cut = [{"messages": MESSAGES, "turns": [{"finish_reason": r}]} for r in ("stop", "length", "loop")]
    rows = [*ended_or_cut, {"messages": MESSAGES}]  # a row without `turns` (any conversations file): ended
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    masks = [e.loss_mask[-1].item() for e in load_conversations(path, tok, 128, {})]
    assert masks == [True, False, False, True]
