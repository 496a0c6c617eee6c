#include "kernels/reference/ops_ref.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace ring::kernels::ref {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        double av = trans_a ? a[p * lda + i] : a[i * lda + p];
        double bv = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        acc += av * bv;
      }
      double prev = beta == 0.f ? 0.0 : static_cast<double>(beta) * c[i * ldc + j];
      c[i * ldc + j] = static_cast<float>(alpha * acc + prev);
    }
  }
}

void rmsnorm_forward(int64_t n, int64_t d, float eps, const float* x, const float* gain, float* y,
                     float* rstd) {
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0.0;
    for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(x[i * d + j]) * x[i * d + j];
    double r = 1.0 / std::sqrt(ss / d + eps);
    rstd[i] = static_cast<float>(r);
    for (int64_t j = 0; j < d; ++j) y[i * d + j] = static_cast<float>(x[i * d + j] * r * gain[j]);
  }
}

void rmsnorm_backward(int64_t n, int64_t d, const float* x, const float* gain, const float* rstd,
                      const float* dy, float* dx, float* dgain) {
  for (int64_t i = 0; i < n; ++i) {
    const double r = rstd[i];
    double dot = 0.0;  // sum_k g_k dy_k x_k
    for (int64_t j = 0; j < d; ++j)
      dot += static_cast<double>(gain[j]) * dy[i * d + j] * x[i * d + j];
    for (int64_t j = 0; j < d; ++j) {
      double g = gain[j], xv = x[i * d + j], dyv = dy[i * d + j];
      dx[i * d + j] = static_cast<float>(r * g * dyv - r * r * r / d * dot * xv);
      dgain[j] = static_cast<float>(dgain[j] + dyv * xv * r);
    }
  }
}

void rope(int64_t n, int64_t heads, int64_t head_dim, float theta, const int64_t* pos, bool inverse,
          float* x) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      float* row = x + (i * heads + h) * head_dim;
      for (int64_t j = 0; j < head_dim / 2; ++j) {
        double angle =
            static_cast<double>(pos[i]) * std::pow(static_cast<double>(theta), -2.0 * j / head_dim);
        if (inverse) angle = -angle;
        double c = std::cos(angle), s = std::sin(angle);
        double x0 = row[2 * j], x1 = row[2 * j + 1];
        row[2 * j] = static_cast<float>(x0 * c - x1 * s);
        row[2 * j + 1] = static_cast<float>(x0 * s + x1 * c);
      }
    }
  }
}

void rope(int64_t n, int64_t heads, int64_t head_dim, const RopeParams& p, const int64_t* pos,
          bool inverse, float* x) {
  const double m = rope_attention_factor(p);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      float* row = x + (i * heads + h) * head_dim;
      for (int64_t j = 0; j < head_dim / 2; ++j) {
        double angle = static_cast<double>(pos[i]) * rope_inv_freq(p, j, head_dim);
        if (inverse) angle = -angle;
        double c = m * std::cos(angle), s = m * std::sin(angle);
        double x0 = row[2 * j], x1 = row[2 * j + 1];
        row[2 * j] = static_cast<float>(x0 * c - x1 * s);
        row[2 * j + 1] = static_cast<float>(x0 * s + x1 * c);
      }
    }
  }
}

namespace {
double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
double phi_cdf(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0));
}
}  // namespace

void swiglu_forward(int64_t n, const float* gate, const float* up, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    double g = gate[i];
    out[i] = static_cast<float>(g * sigmoid(g) * up[i]);
  }
}

void swiglu_backward(int64_t n, const float* gate, const float* up, const float* dout, float* dgate,
                     float* dup) {
  for (int64_t i = 0; i < n; ++i) {
    double g = gate[i], s = sigmoid(g);
    dgate[i] = static_cast<float>(dout[i] * static_cast<double>(up[i]) * s * (1 + g * (1 - s)));
    dup[i] = static_cast<float>(dout[i] * g * s);
  }
}

void gelu_forward(int64_t n, const float* x, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i] * phi_cdf(x[i]));
}

void gelu_backward(int64_t n, const float* x, const float* dout, float* dx) {
  const double inv_sqrt_2pi = 0.3989422804014327;
  for (int64_t i = 0; i < n; ++i) {
    double xv = x[i];
    double grad = phi_cdf(xv) + xv * inv_sqrt_2pi * std::exp(-0.5 * xv * xv);
    dx[i] = static_cast<float>(dout[i] * grad);
  }
}

void embedding_forward(int64_t n, int64_t d, const int32_t* ids, const float* table, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < d; ++j) out[i * d + j] = table[ids[i] * d + j];
  }
}

void embedding_backward(int64_t n, int64_t d, const int32_t* ids, const float* dout,
                        float* dtable) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < d; ++j) dtable[ids[i] * d + j] += dout[i * d + j];
  }
}

void cross_entropy(int64_t n, int64_t vocab, const float* logits, const int32_t* labels,
                   float grad_scale, double* loss_sum, int64_t* valid, float* dlogits) {
  double loss = 0.0;
  int64_t count = 0;
  std::vector<double> row(vocab);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < vocab; ++j) row[j] = logits[i * vocab + j];  // copy: dlogits may alias
    if (labels[i] == -1) {
      if (dlogits) std::fill(dlogits + i * vocab, dlogits + (i + 1) * vocab, 0.f);
      continue;
    }
    ++count;
    double mx = *std::max_element(row.begin(), row.end());
    double sum = 0.0;
    for (double v : row) sum += std::exp(v - mx);
    double lse = mx + std::log(sum);
    loss += lse - row[labels[i]];
    if (dlogits) {
      for (int64_t j = 0; j < vocab; ++j) {
        double p = std::exp(row[j] - lse) - (j == labels[i] ? 1.0 : 0.0);
        dlogits[i * vocab + j] = static_cast<float>(grad_scale * p);
      }
    }
  }
  *loss_sum = loss;
  *valid = count;
}

void adamw_step(int64_t n, const Backend::AdamWParams& hp, float* param, const float* grad,
                float* m, float* v) {
  const double b1 = hp.beta1, b2 = hp.beta2, t = static_cast<double>(hp.step);
  for (int64_t i = 0; i < n; ++i) {
    double g = grad[i];
    double mi = b1 * m[i] + (1 - b1) * g;
    double vi = b2 * v[i] + (1 - b2) * g * g;
    double mhat = mi / (1 - std::pow(b1, t));
    double vhat = vi / (1 - std::pow(b2, t));
    double p = param[i];
    p -= static_cast<double>(hp.lr) * (mhat / (std::sqrt(vhat) + hp.eps) + hp.weight_decay * p);
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    param[i] = static_cast<float>(p);
  }
}

void topk_abs(int64_t n, int64_t k, const float* x, uint32_t* indices, float* values) {
  auto magnitude = [&](int64_t i) {  // NaN ranks above +inf
    float a = std::fabs(x[i]);
    return std::isnan(a) ? INFINITY : a;
  };
  auto is_nan = [&](int64_t i) { return std::isnan(x[i]); };
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    if (is_nan(a) != is_nan(b)) return is_nan(a);
    return magnitude(a) > magnitude(b);
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  for (int64_t i = 0; i < k; ++i) {
    indices[i] = static_cast<uint32_t>(order[i]);
    values[i] = x[order[i]];
  }
}

void fill(int64_t n, float value, float* x) {
  std::fill(x, x + n, value);
}
void scale(int64_t n, float alpha, float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}
void axpy(int64_t n, float alpha, const float* x, float* y) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = static_cast<float>(y[i] + static_cast<double>(alpha) * x[i]);
}
void add(int64_t n, const float* a, const float* b, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
double sum_squares(int64_t n, const float* x) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

}  // namespace ring::kernels::ref
