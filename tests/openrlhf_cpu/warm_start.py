"""A tiny Rooms model that plays like a weak LLM: mostly admissible commands, some wins, some fumbles.

A random-weight model answers gibberish, every step is invalid and every advantage is 0, which
would make checks of the advantage hand-off vacuous. A few seconds of supervised training on a
noisy expert's episodes fixes that.
"""

from __future__ import annotations

import random
from pathlib import Path

import gymnasium as gym
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hgpo_env  # noqa: F401  (registers the HGPO-* ids)
from hgpo_train.config import Config
from hgpo_train.update.tiny_model import build_tiny_model

NOISE = 0.4
"""Share of steps where the teacher picks a random admissible command instead of the expert's."""


def teacher_pairs(config: Config, episodes: int, seed: int = 0) -> list[tuple[str, str]]:
    """(prompt, command) pairs of noisy-expert episodes in the config's env."""
    rng = random.Random(seed)
    env = gym.make(
        config.env.env_id,
        history_length=config.env.history_length,
        response_format=config.env.response_format,
        max_steps=config.env.max_steps,
        **config.env.kwargs,
    )
    pairs = []
    for episode in range(episodes):
        prompt, info = env.reset(seed=seed * 100_000 + episode)
        done = False
        while not done:
            command = env.unwrapped.expert_action()
            if rng.random() < NOISE:
                command = rng.choice(info["admissible_actions"])
            pairs.append((prompt, command))
            prompt, _, terminated, truncated, info = env.step(command)
            done = terminated or truncated
    return pairs


def warm_tiny_model(config: Config, out_dir: Path, steps: int = 150, batch: int = 16) -> str:
    """Build the config's tiny model into ``out_dir`` and fit it to a noisy expert; returns the folder."""
    build_tiny_model(config.env, config.tiny, out_dir, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows = []
    for prompt, command in teacher_pairs(config, episodes=64):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        response_ids = tokenizer(command, add_special_tokens=False)["input_ids"] + [end]
        rows.append((prompt_ids, response_ids))
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(0)
    model.train()
    for _ in range(steps):
        chunk = rng.sample(rows, batch)
        width = max(len(p) + len(r) for p, r in chunk)
        ids = torch.full((batch, width), tokenizer.pad_token_id or 0)
        labels = torch.full((batch, width), -100)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, (p, r) in enumerate(chunk):
            seq = p + r
            ids[i, : len(seq)] = torch.tensor(seq)
            labels[i, len(p) : len(seq)] = torch.tensor(r)
            mask[i, : len(seq)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(out_dir)
    return str(out_dir)
