"""A minimal LoRA fine-tune: what the image runs as `python /opt/app/train.py` (after `imagekit-doctor`)."""

import torch
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256))
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True))
    model.to(device)
    optimizer = torch.optim.AdamW((p for p in model.parameters() if p.requires_grad), lr=1e-3)
    ids = torch.randint(0, 256, (4, 32), device=device)
    for step in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.3f} on {device}")


if __name__ == "__main__":
    main()
