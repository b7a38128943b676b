"""The guard a quantized candidate must pass against the reference precision."""

from __future__ import annotations

from pydantic import Field

from infertune.tuner.api.base import ApiModel, Quantization


class QualityGuard(ApiModel):
    enabled: bool = True
    reference: Quantization = Field(
        default="bf16", description="Precision the candidates are compared against."
    )
    min_top1_agreement: float = Field(
        default=0.9, ge=0, le=1, description="Share of next tokens equal to the reference's."
    )
    max_kl_divergence: float | None = Field(
        default=None,
        ge=0,
        description="Mean KL(reference || candidate) of next-token distributions.",
    )
    max_perplexity_increase: float | None = Field(
        default=None,
        ge=0,
        description=(
            "Largest relative perplexity increase over the reference on the project's held-out "
            "text (0.05 = +5%), measured on the engine that serves the candidate."
        ),
    )
    prompts: list[str] = Field(
        default_factory=list,
        max_length=1000,
        description="Evaluation prompts (the user's own); built-in prompts when empty.",
    )
    eval_tokens: int = Field(default=32, ge=1, le=4096)
