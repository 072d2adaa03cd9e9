// The per-step loops of NRUScan (trainers/kernels_nru.py) in C++: the same ATen calls on the same
// views in the same order as the Python loops there, so the same numbers bit for bit, without the
// interpreter's cost per call and below the autograd dispatch keys (together a third of an NRU step
// at the cells benchmark's shape). In-place writes here bump no version counter: every buffer is the
// scan's own, and what the backward needs is saved after the loop.
// The Python loops stay: the reference in the tests and the fallback where no C++ compiler is found.
//
// Every per-step argument is a view with a leading T dim (made once in kernels_nru.py); the loops
// unbind it, as the Python loops do.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

namespace {

using at::Tensor;
using std::vector;

constexpr double kNormEps = 1e-12;  // kernels_nru.NORM_EPS

// steps: xp, z, zin, h, oin, o, ab, p, q, n, cn, m (each [T, ...]);
// fixed: w_z, w_o, b_o, v, u, v4, v_rows, u_rows, m_bufs, sign.
// Returns LayerNorm's per-step mean and rstd (empty without LayerNorm).
vector<Tensor> nru_forward_steps(
    const vector<Tensor>& steps, vector<Tensor> fixed, const c10::optional<Tensor>& ln_w,
    const c10::optional<Tensor>& ln_b, bool use_relu, double ln_eps) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;  // no graph is built here: skip its keys
  vector<vector<Tensor>> s;
  for (const auto& t : steps) s.push_back(t.unbind(0));
  Tensor &w_z = fixed[0], &w_o = fixed[1], &b_o = fixed[2], &v = fixed[3], &u = fixed[4];
  Tensor &v4 = fixed[5], &v_rows = fixed[6], &u_rows = fixed[7], &sign = fixed[9];
  vector<Tensor> m_bufs = fixed[8].unbind(0);  // [B, 1, M] each
  vector<Tensor> m_rows = fixed[8].squeeze(2).unbind(0);  // [B, M] each
  const int64_t T = steps[0].size(0), N = steps[0].size(2);
  const bool ln = ln_w.has_value();
  vector<Tensor> means, rstds;
  for (int64_t i = 0; i < T; ++i) {
    Tensor &xp = s[0][i], &zin = s[2][i], &h = s[3][i], &oin = s[4][i], &o = s[5][i];
    Tensor &ab = s[6][i], &p = s[7][i], &q = s[8][i], &n = s[9][i], &cn = s[10][i], &m = s[11][i];
    Tensor z = s[1][i];
    at::addmm_out(z, xp, zin, w_z);  // z_i (eq. 9)
    if (ln) {
      auto out = at::native_layer_norm(z, {N}, ln_w, ln_b, ln_eps);
      z = std::get<0>(out);
      means.push_back(std::get<1>(out));
      rstds.push_back(std::get<2>(out));
    }
    at::clamp_min_out(h, z, 0.0);  // h_i = ReLU(z)
    at::addmm_out(o, b_o, oin, w_o);  // o_i = b_H + W_H [m_{i−1}, h_i]
    at::mul_out(v4, p, q);  // V = ρ(p qᵀ)
    if (use_relu) v4.relu_();
    at::mul_out(u, v, v).mul_(u).copysign_(v);  // U = V³|V|
    at::linalg_vecdot_out(n, u_rows, v_rows).pow_(0.2).clamp_min_(kNormEps);  // n
    at::mul_out(cn, use_relu ? ab.relu() : ab, sign).div_(n);  // c / n
    at::baddbmm_out(m_bufs[~i & 1], m_bufs[i & 1], cn, v);  // m_i = m_{i−1} + Σ (c/n) V
    m.copy_(m_rows[~i & 1]);
  }
  if (!ln) return {};
  return {at::stack(means), at::stack(rstds)};
}

// steps: g, fp, fq, p, q, kappa, coef, gab, hmask, d_p, d_q, d_ab, d_z, doz, dzo, dz_hat, z, mean, rstd
// (the last four only with LayerNorm; each [T, ...]);
// fixed: vu, v, u, vu5, dV, dV4, dcr, gamma, gamma2, dh, w_dh, w_dm, dm_buf, dm_rows.
// gm: ∂L/∂m_i from outside, [T, B, M], or none.
void nru_backward_steps(
    const vector<Tensor>& steps, vector<Tensor> fixed, const c10::optional<Tensor>& gm,
    const c10::optional<Tensor>& ln_w, const c10::optional<Tensor>& ln_b, bool use_relu) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  vector<vector<Tensor>> s;
  for (const auto& t : steps) s.push_back(t.unbind(0));
  Tensor &vu = fixed[0], &v = fixed[1], &u = fixed[2], &vu5 = fixed[3], &dV = fixed[4];
  Tensor &dV4 = fixed[5], &dcr = fixed[6], &gamma = fixed[7], &gamma2 = fixed[8], &dh = fixed[9];
  Tensor &w_dh = fixed[10], &w_dm = fixed[11];
  vector<Tensor> dms = fixed[12].unbind(0), dm_rows = fixed[13].unbind(0);
  const int64_t T = steps[0].size(0), N = steps[0].size(2);
  const bool ln = ln_w.has_value();
  int64_t j = T & 1;  // step i writes ∂m_{i−1} into the other buffer, dms[i & 1]
  if (gm.has_value()) dms[j].copy_((*gm)[T - 1]);
  for (int64_t i = T - 1; i >= 0; --i) {
    Tensor &dm = dms[j], &dm_row = dm_rows[j];
    at::mul_out(vu5, s[1][i], s[2][i]);  // V and U again
    if (use_relu) vu.relu_();
    at::linalg_vecdot_out(dcr, v, dm_row);  // ⟨dm, V⟩
    at::mul_out(gamma2, dcr, s[5][i]);
    at::mul_out(dV, dm_row, s[6][i]).addcmul_(gamma, u, -1.0);  // ∂V
    if (use_relu) dV.mul_(v > 0);  // ρ'
    at::linalg_vecdot_out(s[9][i], dV4, s[4][i]);  // ∂p = ∂V q
    at::linalg_vecdot_out(s[10][i], dV4, s[3][i], -2);  // ∂q = ∂Vᵀ p
    at::mul_out(s[11][i], dcr, s[7][i]);  // ∂(α̃, β̃)
    at::addmm_out(dh, s[0][i], s[13][i], w_dh);  // ∂h_i = g_i + ∂o_i W_Hh + ∂z_{i+1} W_h
    if (!ln) {
      at::mul_out(s[12][i], dh, s[8][i]);  // ∂z_i
    } else {
      at::mul_out(s[15][i], dh, s[8][i]);  // ∂ẑ_i, then LayerNorm's backward
      s[12][i].copy_(std::get<0>(at::native_layer_norm_backward(
          s[15][i], s[16][i], {N}, s[17][i], s[18][i], ln_w, ln_b, {true, false, false})));
    }
    if (i == 0) break;  // m_{−1} = 0 is no input
    const int64_t jn = i & 1;
    if (gm.has_value()) {  // ∂L/∂m_{i−1} from outside
      at::add_out(dms[jn], dm, (*gm)[i - 1]).addmm_(s[14][i], w_dm);
    } else {
      at::addmm_out(dms[jn], dm, s[14][i], w_dm);  // ∂m_{i−1}
    }
    j = jn;
  }
}

}  // namespace

TORCH_LIBRARY(memsweep_nru, m) {
  m.def("forward_steps", &nru_forward_steps);
  m.def("backward_steps", &nru_backward_steps);
}
