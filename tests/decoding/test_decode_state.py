"""DecodeState's bookkeeping, step by step: where each row finished (what its TPOT is computed from) and which
device its tensors live on. Mutation testing found both unchecked: a step counter that stopped at 1, a first-token
step of +1, and the token buffer left on the CPU (the meta device shows it without a GPU)."""

import pytest
import torch

from minispec.decoding.plain import DecodeState


def test_each_row_records_the_step_it_finished_at():
    """Rows of max_new_tokens 4 with EOS 9: row 0 ends at its first token (step -1), row 1 at decode step 0 (EOS),
    row 2 at step 2 (its fourth token)."""
    state = DecodeState([[1, 2], [3], [4, 5, 6]], 4, [9], "cpu")
    one = torch.ones(3, dtype=torch.long)  # (B,) one token per row per step
    state.emit(torch.tensor([[9], [1], [1]]), one)  # the prefill's first tokens
    end = state.start_loop()
    assert end.running == 2
    for new in ([[1], [9], [1]], [[2], [2], [2]], [[3], [3], [3]]):
        state.emit(torch.tensor(new), one)
        end = state.end_step()
    assert end.running == 0 and state.finish_step.tolist() == [-1, 0, 2]
    assert (state.total - state.prompt_len).tolist() == [1, 2, 4]


def test_every_tensor_lives_on_the_states_device():
    state = DecodeState([[1, 2], [3]], 4, [9], "meta")
    tensors = {k: v for k, v in vars(state).items() if isinstance(v, torch.Tensor)}
    assert {"seq", "prompt_len", "total", "done", "finish_step", "from_draft", "eos"} <= set(tensors)
    assert all(t.device.type == "meta" for t in tensors.values())


def test_a_loop_whose_steps_emit_nothing_stops_with_an_error_instead_of_spinning():
    """Each decode step gives every running row a token, so max_new_tokens - 1 steps finish every row; a row still
    running after them is a defect (a lost token, a wrong stop), named at once rather than looped on forever."""
    state = DecodeState([[1], [2, 3]], 3, [], "cpu")
    state.emit(torch.tensor([[4], [4]]), torch.ones(2, dtype=torch.long))
    assert state.start_loop().running == 2
    assert state.end_step().running == 2  # step 1 emitted nothing: one step is left
    with pytest.raises(RuntimeError, match="2 rows still running after 2 decode steps"):
        state.end_step()
