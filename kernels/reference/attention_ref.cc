// Scalar reference attention (see attention_ref.h).
#include "kernels/reference/attention_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace ring::kernels::ref {
namespace {

Status check(const AttentionArgs& a) {
  if (a.q_len < 0 || a.kv_len < 0 || a.heads <= 0 || a.kv_heads <= 0 || a.head_dim <= 0 ||
      a.heads % a.kv_heads != 0 || (a.q_doc == nullptr) != (a.k_doc == nullptr)) {
    return Status::kInvalidArgument;
  }
  if (a.q_len > 0 && (a.q == nullptr || (a.causal && a.q_pos == nullptr))) {
    return Status::kInvalidArgument;
  }
  if (a.kv_len > 0 && (a.k == nullptr || a.v == nullptr || (a.causal && a.k_pos == nullptr))) {
    return Status::kInvalidArgument;
  }
  if (a.dtype != DType::kF32) return Status::kUnsupported;
  return Status::kOk;
}

// Scaled scores of query row (i, h) against every key; -inf where masked. s: [kv_len].
void scores(const AttentionArgs& a, int64_t i, int64_t h, std::vector<double>& s) {
  const auto* q = static_cast<const float*>(a.q);
  const auto* k = static_cast<const float*>(a.k);
  const int64_t kvh = h / (a.heads / a.kv_heads), d = a.head_dim;
  s.assign(a.kv_len, -std::numeric_limits<double>::infinity());
  for (int64_t j = 0; j < a.kv_len; ++j) {
    if (!attention_allowed(a, i, j)) continue;
    double dot = 0;
    for (int64_t x = 0; x < d; ++x) {
      dot += static_cast<double>(q[(i * a.heads + h) * d + x]) * k[(j * a.kv_heads + kvh) * d + x];
    }
    s[j] = dot * a.scale;
  }
}

}  // namespace

bool attention_allowed(const AttentionArgs& a, int64_t i, int64_t j) {
  if (a.causal && a.k_pos[j] > a.q_pos[i]) return false;
  if (a.q_doc != nullptr && a.q_doc[i] != a.k_doc[j]) return false;
  return true;
}

Status attention_forward(const AttentionArgs& a, float* out, float* lse) {
  if (Status s = check(a); s != Status::kOk) return s;
  if (a.q_len > 0 && (out == nullptr || lse == nullptr)) return Status::kInvalidArgument;
  const auto* v = static_cast<const float*>(a.v);
  const int64_t d = a.head_dim, group = a.heads / a.kv_heads;
  std::vector<double> s, o(d);
  for (int64_t i = 0; i < a.q_len; ++i) {
    for (int64_t h = 0; h < a.heads; ++h) {
      scores(a, i, h, s);
      const double m = a.kv_len > 0 ? *std::max_element(s.begin(), s.end())
                                    : -std::numeric_limits<double>::infinity();
      float* dst = out + (i * a.heads + h) * d;
      if (m == -std::numeric_limits<double>::infinity()) {  // no allowed key
        std::fill(dst, dst + d, 0.f);
        lse[i * a.heads + h] = -std::numeric_limits<float>::infinity();
        continue;
      }
      double sum = 0;
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t j = 0; j < a.kv_len; ++j) {
        const double p = std::exp(s[j] - m);  // 0 for masked keys
        sum += p;
        for (int64_t x = 0; x < d; ++x) o[x] += p * v[(j * a.kv_heads + h / group) * d + x];
      }
      for (int64_t x = 0; x < d; ++x) dst[x] = static_cast<float>(o[x] / sum);
      lse[i * a.heads + h] = static_cast<float>(m + std::log(sum));
    }
  }
  return Status::kOk;
}

Status attention_merge(int64_t tokens, int64_t heads, int64_t head_dim, float* out_a, float* lse_a,
                       const float* out_b, const float* lse_b) {
  if (tokens < 0 || heads <= 0 || head_dim <= 0) return Status::kInvalidArgument;
  const double ninf = -std::numeric_limits<double>::infinity();
  for (int64_t r = 0; r < tokens * heads; ++r) {
    const double la = lse_a[r], lb = lse_b[r];
    if (la == ninf && lb == ninf) continue;
    const double m = std::max(la, lb);
    const double wa = la == ninf ? 0.0 : std::exp(la - m);
    const double wb = lb == ninf ? 0.0 : std::exp(lb - m);
    const double sum = wa + wb;
    for (int64_t x = 0; x < head_dim; ++x) {
      const int64_t e = r * head_dim + x;
      out_a[e] = static_cast<float>((wa * out_a[e] + wb * out_b[e]) / sum);
    }
    lse_a[r] = static_cast<float>(m + std::log(sum));
  }
  return Status::kOk;
}

Status attention_backward_prepare(DType dtype, int64_t tokens, int64_t heads, int64_t head_dim,
                                  const float* out, const void* dout, float* delta) {
  if (tokens < 0 || heads <= 0 || head_dim <= 0) return Status::kInvalidArgument;
  if (dtype != DType::kF32) return Status::kUnsupported;
  const auto* g = static_cast<const float*>(dout);
  for (int64_t r = 0; r < tokens * heads; ++r) {
    double acc = 0;
    for (int64_t x = 0; x < head_dim; ++x) {
      acc += static_cast<double>(g[r * head_dim + x]) * out[r * head_dim + x];
    }
    delta[r] = static_cast<float>(acc);
  }
  return Status::kOk;
}

Status attention_backward(const AttentionArgs& a, const void* dout, const float* lse,
                          const float* delta, float* dq, float* dk, float* dv) {
  if (Status s = check(a); s != Status::kOk) return s;
  const auto* q = static_cast<const float*>(a.q);
  const auto* k = static_cast<const float*>(a.k);
  const auto* v = static_cast<const float*>(a.v);
  const auto* g = static_cast<const float*>(dout);
  const int64_t d = a.head_dim, group = a.heads / a.kv_heads;
  // dk, dv accumulated in double over all query rows, added once at the end.
  std::vector<double> dk_acc(a.kv_len * a.kv_heads * d, 0.0), dv_acc(dk_acc.size(), 0.0);
  std::vector<double> s, dq_row(d);
  for (int64_t i = 0; i < a.q_len; ++i) {
    for (int64_t h = 0; h < a.heads; ++h) {
      const int64_t row = i * a.heads + h, kvh = h / group;
      if (lse[row] == -std::numeric_limits<float>::infinity()) continue;  // P = 0
      scores(a, i, h, s);
      std::fill(dq_row.begin(), dq_row.end(), 0.0);
      for (int64_t j = 0; j < a.kv_len; ++j) {
        if (!attention_allowed(a, i, j)) continue;
        const double p = std::exp(s[j] - lse[row]);  // P from the final lse
        const int64_t kv = (j * a.kv_heads + kvh) * d;
        double dp = 0;
        for (int64_t x = 0; x < d; ++x) dp += static_cast<double>(g[row * d + x]) * v[kv + x];
        const double ds = p * (dp - delta[row]) * a.scale;
        for (int64_t x = 0; x < d; ++x) {
          dq_row[x] += ds * k[kv + x];
          dk_acc[kv + x] += ds * q[row * d + x];
          dv_acc[kv + x] += p * g[row * d + x];
        }
      }
      for (int64_t x = 0; x < d; ++x) dq[row * d + x] += static_cast<float>(dq_row[x]);
    }
  }
  for (size_t e = 0; e < dk_acc.size(); ++e) {
    dk[e] += static_cast<float>(dk_acc[e]);
    dv[e] += static_cast<float>(dv_acc[e]);
  }
  return Status::kOk;
}

}  // namespace ring::kernels::ref
