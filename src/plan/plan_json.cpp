// Plan::to_json: the plan as `dsmla plan` prints it. Keys keep a fixed,
// readable order (ordered_json) so the output is deterministic.
#include <string>

#include <nlohmann/json.hpp>

#include "dsmla/plan.hpp"
#include "plan/latent_staging.hpp"

namespace dsmla {
namespace {

using Json = nlohmann::ordered_json;

Json region_json(const WorkspaceRegion& region) {
  return Json{{"offset", region.offset}, {"bytes", region.bytes}};
}

Json counts_json(const Plan& plan) {
  std::int64_t decode_tokens = 0, sparse_prefill_tokens = 0, dense_tokens = 0;
  for (TokenPath path : plan.token_path) {
    decode_tokens += path == TokenPath::decode;
    sparse_prefill_tokens += path == TokenPath::sparse;
    dense_tokens += path == TokenPath::dense;
  }
  // Every request in one of the five counts: decode, sparse prefill, dense,
  // split (dense and sparse: its dense part is also one of plan.dense_requests), empty.
  std::int64_t sparse_prefill_requests = 0, dense_requests = 0, split_requests = 0, empty_requests = 0;
  for (const RequestRoute& route : plan.routes) {
    if (route.q_len == 0) ++empty_requests;
    else if (route.is_split()) ++split_requests;
    else if (route.path == TokenPath::sparse) ++sparse_prefill_requests;
    else if (route.path == TokenPath::dense) ++dense_requests;
  }
  return Json{{"decode_requests", plan.decode_requests.size()},
              {"sparse_prefill_requests", sparse_prefill_requests},
              {"dense_requests", dense_requests},
              {"split_requests", split_requests},
              {"empty_requests", empty_requests},
              {"decode_tokens", decode_tokens},
              {"sparse_prefill_tokens", sparse_prefill_tokens},
              {"dense_tokens", dense_tokens},
              {"padding_tokens", plan.padding_tokens}};
}

}  // namespace

std::string Plan::to_json() const {
  Json routes_json = Json::array();
  for (std::size_t r = 0; r < routes.size(); ++r) {
    const RequestRoute& route = routes[r];
    routes_json.push_back(Json{{"request", r},
                               {"q_len", route.q_len},
                               {"ctx_len", route.ctx_len},
                               {"seq_len", route.seq_len},
                               {"path", route.path_name()},
                               {"dense_q_len", route.dense_q_len},
                               {"is_decode", route.is_decode},
                               {"dense_exact", route.dense_exact},
                               {"dense_flops", route.dense_flops},
                               {"sparse_flops", route.sparse_flops},
                               {"split_dense_flops", route.split_dense_flops},
                               {"split_sparse_flops", route.split_sparse_flops}});
  }
  Json dense_json = Json::array();
  for (const DenseRequest& d : dense_requests)
    dense_json.push_back(Json{{"request", d.request},
                              {"q_start", d.q_start},
                              {"q_len", d.q_len},
                              {"ctx_len", d.ctx_len},
                              {"seq_len", d.seq_len},
                              {"kv_row_start", d.kv_row_start}});

  // What the CUDA backend stages as bf16 for this plan (fp8 caches; unless
  // DSMLA_STAGE_LATENT=0): its rows are part of the backend's workspace_bytes().
  const LatentStaging staging = plan_latent_staging(*this);
  Json staged_requests = Json::array();
  for (std::size_t r = 0; r < staging.row_base.size(); ++r)
    if (staging.row_base[r] >= 0) staged_requests.push_back(r);

  const Json json{
      {"options",
       {{"num_heads", options.num_heads},
        {"cache_format", to_string(options.cache_format)},
        {"topk", options.topk},
        {"decode_threshold", options.decode_threshold},
        {"policy", to_string(options.policy)},
        {"dense_cost_factor", options.dense_cost_factor},
        {"indexer", options.indexer},
        {"index_num_heads", options.index_num_heads},
        {"index_head_dim", options.index_head_dim}}},
      {"num_tokens", num_tokens},
      {"num_requests", num_requests},
      {"block_size", block_size},
      {"max_blocks_per_request", max_blocks_per_request},
      {"num_cache_slots", num_cache_slots},
      {"counts", counts_json(*this)},
      {"sparse_tokens", sparse_tokens.size()},
      {"routes", routes_json},
      {"dense_requests", dense_json},
      {"dense_kv_rows", dense_kv_rows},
      {"dense_query_rows", dense_query_rows},
      {"max_dense_seq_len", max_dense_seq_len},
      {"max_dense_q_len", max_dense_q_len},
      {"indexer",
       {{"rows", indexer_rows.size()},
        {"full_set_tokens", full_set_tokens.size()},
        {"max_pos", max_indexer_pos},
        {"flops", indexer_flops}}},
      {"latent_staging",
       {{"requests", staged_requests},
        {"rows", staging.rows},
        {"bytes", staging.rows * 2 * kLatentKeyDim}}},
      {"workspace",
       {{"bytes", workspace_bytes},
        {"sparse_q", region_json(ws_sparse_q)},
        {"sparse_o", region_json(ws_sparse_o)},
        {"sparse_slots", region_json(ws_sparse_slots)},
        {"dense_latent", region_json(ws_dense_latent)},
        {"dense_kv", region_json(ws_dense_kv)},
        {"index_topk", region_json(ws_index_topk)}}}};
  return json.dump(2);
}

}  // namespace dsmla
