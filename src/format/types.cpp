#include <algorithm>
#include <cmath>
#include <string>

#include "dsmla/format.hpp"
#include "dsmla/types.hpp"

namespace dsmla {

int bytes_per_token(CacheFormat f) {
  if (const int bytes = cache_token_bytes(f); bytes > 0) return bytes;
  throw Error("unknown cache format " + std::to_string(static_cast<int>(f)));
}

std::string_view to_string(CacheFormat f) {
  switch (f) {
    case CacheFormat::bf16: return "bf16";
    case CacheFormat::fp8_ds_mla: return "fp8_ds_mla";
    case CacheFormat::fp8: return "fp8";
  }
  return "?";
}

std::string_view to_string(RoutingPolicy p) {
  switch (p) {
    case RoutingPolicy::per_request: return "per_request";
    case RoutingPolicy::per_batch: return "per_batch";
    case RoutingPolicy::force_sparse: return "force_sparse";
    case RoutingPolicy::split_at_topk: return "split_at_topk";
  }
  return "?";
}

std::string_view to_string(TokenPath p) {
  switch (p) {
    case TokenPath::padding: return "padding";
    case TokenPath::decode: return "decode";
    case TokenPath::sparse: return "sparse";
    case TokenPath::dense: return "dense";
  }
  return "?";
}

CacheFormat parse_cache_format(std::string_view s) {
  if (s == "bf16") return CacheFormat::bf16;
  if (s == "fp8_ds_mla") return CacheFormat::fp8_ds_mla;
  if (s == "fp8") return CacheFormat::fp8;
  throw Error("unknown cache format '" + printable(s) + "' (expected bf16, fp8_ds_mla or fp8)");
}

RoutingPolicy parse_routing_policy(std::string_view s) {
  if (s == "per_request") return RoutingPolicy::per_request;
  if (s == "per_batch") return RoutingPolicy::per_batch;
  if (s == "force_sparse") return RoutingPolicy::force_sparse;
  if (s == "split_at_topk") return RoutingPolicy::split_at_topk;
  throw Error("unknown routing policy '" + printable(s) +
              "' (expected per_request, per_batch, force_sparse or split_at_topk)");
}

std::string printable(std::string_view text, std::size_t max_chars) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(std::min(text.size(), max_chars) + 16);
  std::size_t used = 0;  // input bytes represented in `out`
  for (; used < text.size(); ++used) {
    const auto c = static_cast<unsigned char>(text[used]);
    char piece[4];
    std::size_t n = 0;
    if (c == '\\') {
      piece[n++] = '\\';
      piece[n++] = '\\';
    } else if (c == '\n') {
      piece[n++] = '\\';
      piece[n++] = 'n';
    } else if (c < 0x20 || c >= 0x7f) {
      piece[n++] = '\\';
      piece[n++] = 'x';
      piece[n++] = kHex[c >> 4];
      piece[n++] = kHex[c & 15];
    } else {
      piece[n++] = static_cast<char>(c);
    }
    if (out.size() + n > max_chars) break;
    out.append(piece, n);
  }
  if (used < text.size()) out += "...(" + std::to_string(text.size()) + " bytes)";
  return out;
}

double default_softmax_scale() {
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  return std::pow(192.0, -0.5) * mscale * mscale;
}

}  // namespace dsmla
