// A naive float64 reference for one (token, head) of the attention forward,
// written straight from the DESIGN §2 formulas and sharing no code with the CPU
// backend (no key tables, no head groups, no threads). Tests use it as an
// independent check of both backend paths: the caller lists the attended
// positions explicitly and passes their latent rows.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace dsmla::reference {

struct HeadQuery {
  const std::uint16_t* q = nullptr;       // 192 bf16 of this token and head: [q_nope 128 | q_pe 64]
  const std::uint16_t* w_kv_b = nullptr;  // [H*256, 512] bf16 (the full weight)
  int head = 0;                           // h: W_UK(h) = rows h*256.., W_UV(h) = rows h*256+128..
  double softmax_scale = 0;
};

struct HeadResult {
  std::vector<double> out;  // 128 values, not rounded
  double lse = 0;           // ln(sum exp(score)); -inf (and out = 0) when no position is attended
};

// Absorbed ("MQA") formula over latent keys: `latents` holds n rows of 576
// values [kv_c | k_pe], one per attended position.
HeadResult absorbed_attention(const HeadQuery& query, std::span<const double> latents);

// Up-projected ("MHA") formula: K(s) = [W_UK(h) kv_c(s) | k_pe(s)], V(s) = W_UV(h) kv_c(s).
HeadResult mha_attention(const HeadQuery& query, std::span<const double> latents);

}  // namespace dsmla::reference
