"""Privacy accounting: zCDP, Rényi-DP curves, conversions to (ε, δ), composition helpers.

Pure functions only (no I/O, no state, no randomness). This module fixes the
ledger's currency:

* Gaussian releases cost ρ (zero-concentrated DP, Bun & Steinke 2016); ρ adds
  under (adaptive) composition.
* Anything else costs a Rényi-DP (RDP) curve ε(α) on the fixed order grid
  :data:`ORDERS` (Mironov 2017); curves add order by order.

A :class:`Cost` is the cost of one charge. ``cost_epsilon`` reports it as
(ε, δ)-DP with the tightest conversion valid for its kind. A discrete Gaussian
charge also carries a μ-GDP claim (``Cost.gdp_mu``, :mod:`dpgate.accounting.gdp`)
that the ledger's Gaussian-DP filter composes exactly.

The package is split by concept, every name re-exported here:
:mod:`~dpgate.accounting.orders` (the order grid, argument checks, basic RDP curves),
:mod:`~dpgate.accounting.conversions` (to (ε, δ), the cap's ρ),
:mod:`~dpgate.accounting.cost` (:class:`Cost`), :mod:`~dpgate.accounting.composition`
((ε, δ) helpers), :mod:`~dpgate.accounting.sgd` (DP-SGD),
:mod:`~dpgate.accounting.attack` (attack curves) and :mod:`~dpgate.accounting.gdp`
(Gaussian DP).

Conventions used by every function here:

* ρ and ε are in nats (natural logarithms); δ is a probability in [0, 1).
* "per release" vs "total" is stated in each docstring; every conversion takes
  the *total* (composed) ρ or curve. Never convert per release and sum the ε's
  (that is the 30.0-vs-3.97 mistake: see DESIGN.md, Accounting).
* Reported ε is never negative, is non-increasing in δ, and δ = 0 with ρ > 0
  gives ``math.inf`` at once.
* Invalid arguments (NaN, negative, zero where not allowed, wrong grid) raise
  :class:`ValueError` whose message names the argument. Callers that face the
  user (HTTP, CLI) turn it into a :class:`dpgate.errors.InvalidBudget` or
  :class:`dpgate.errors.InvalidRequest`.

References
----------
[BS16]  M. Bun, T. Steinke. Concentrated Differential Privacy: Simplifications,
        Extensions, and Lower Bounds. TCC 2016 (arXiv:1605.02065).
[Mir17] I. Mironov. Rényi Differential Privacy. CSF 2017 (arXiv:1702.07476).
[CKS20] C. Canonne, G. Kamath, T. Steinke. The Discrete Gaussian for Differential
        Privacy. NeurIPS 2020 (arXiv:2004.00010).
[BBG+20] B. Balle, G. Barthe, M. Gaboardi, J. Hsu, T. Sato. Hypothesis Testing
        Interpretations and Rényi Differential Privacy. AISTATS 2020 (arXiv:1905.09982).
[BW18]  B. Balle, Y.-X. Wang. Improving the Gaussian Mechanism for Differential
        Privacy: Analytical Calibration and Optimal Denoising. ICML 2018.
[DRS22] J. Dong, A. Roth, W. Su. Gaussian Differential Privacy. JRSS-B 2022.
[DRV10] C. Dwork, G. Rothblum, S. Vadhan. Boosting and Differential Privacy. FOCS 2010.
[DR14]  C. Dwork, A. Roth. The Algorithmic Foundations of Differential Privacy. 2014.
[Vad17] S. Vadhan. The Complexity of Differential Privacy. 2017.
[BBG18] B. Balle, G. Barthe, M. Gaboardi. Privacy Amplification by Subsampling:
        Tight Analyses via Couplings and Divergences. NeurIPS 2018.
[LQS12] N. Li, W. Qardaji, D. Su. On Sampling, Anonymization, and Differential
        Privacy. ASIACCS 2012.
[KOV15] P. Kairouz, S. Oh, P. Viswanath. The Composition Theorem for Differential
        Privacy. ICML 2015.
[WZ10]  L. Wasserman, S. Zhou. A Statistical Framework for Differential Privacy.
        JASA 2010.
[vEH14] T. van Erven, P. Harremoës. Rényi Divergence and Kullback-Leibler
        Divergence. IEEE Trans. Inf. Theory 2014.
[ST22]  A. Smith, A. Thakurta. Fully Adaptive Composition for Gaussian Differential Privacy.
        2022 (arXiv:2210.17520).
[MTZ19] I. Mironov, K. Talwar, L. Zhang. Rényi Differential Privacy of the Sampled
        Gaussian Mechanism. 2019 (arXiv:1908.10530).
"""

from __future__ import annotations

from dpgate.accounting.orders import (  # noqa: F401 - re-exported
    CONVERSIONS,
    Conversion,
    CostKind,
    ORDERS,
    SEED_ORDERS,
    gaussian_rdp,
    gaussian_rho,
    gaussian_sigma,
    laplace_rdp,
    pure_dp_rdp,
)
from dpgate.accounting.conversions import (  # noqa: F401 - re-exported
    check_nondecreasing,
    curve_on_grid,
    gaussian_epsilon_exact,
    rdp_epsilon_basic,
    rdp_epsilon_tight,
    rho_for_cap,
    zcdp_epsilon,
    zcdp_epsilon_simple,
    zcdp_epsilon_tight,
    zcdp_optimal_order,
)
from dpgate.accounting.cost import (  # noqa: F401 - re-exported
    Cost,
    cost_epsilon,
)
from dpgate.accounting.composition import (  # noqa: F401 - re-exported
    advanced_composition,
    basic_composition,
    group_privacy,
    group_privacy_rho,
    max_true_positive_rate,
    poisson_subsampling_epsilon,
)
from dpgate.accounting.sgd import (  # noqa: F401 - re-exported
    DP_SGD_SAMPLERS,
    dp_sgd_cost,
    dp_sgd_rdp,
    poisson_subsampled_gaussian_rdp,
)
from dpgate.accounting.attack import (  # noqa: F401 - re-exported
    dp_attack_curve,
    gdp_mu,
    gdp_true_positive_rate,
    periods_epsilon,
    rdp_attack_curve,
    rdp_true_positive_rate,
    zcdp_attack_curve,
    zcdp_true_positive_rate,
)
from dpgate.accounting.gdp import (  # noqa: F401 - re-exported
    DISCRETE_GAUSSIAN_MIN_SIGMA,
    discrete_gaussian_mu,
    discrete_gaussian_unit_mu,
    gdp_delta,
    gdp_epsilon,
    gdp_mu_for_cap,
    pure_dp_mu,
)

__all__ = [
    "ORDERS",
    "SEED_ORDERS",
    "CONVERSIONS",
    "Cost",
    "gaussian_rho",
    "gaussian_sigma",
    "gaussian_rdp",
    "laplace_rdp",
    "pure_dp_rdp",
    "zcdp_epsilon_simple",
    "zcdp_epsilon_tight",
    "zcdp_optimal_order",
    "gaussian_epsilon_exact",
    "rdp_epsilon_basic",
    "rdp_epsilon_tight",
    "zcdp_epsilon",
    "cost_epsilon",
    "rho_for_cap",
    "basic_composition",
    "advanced_composition",
    "group_privacy",
    "group_privacy_rho",
    "poisson_subsampling_epsilon",
    "curve_on_grid",
    "max_true_positive_rate",
    "DP_SGD_SAMPLERS",
    "poisson_subsampled_gaussian_rdp",
    "dp_sgd_rdp",
    "dp_sgd_cost",
    "dp_attack_curve",
    "gdp_mu",
    "gdp_true_positive_rate",
    "rdp_true_positive_rate",
    "zcdp_true_positive_rate",
    "rdp_attack_curve",
    "zcdp_attack_curve",
    "periods_epsilon",
    "DISCRETE_GAUSSIAN_MIN_SIGMA",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu_for_cap",
    "discrete_gaussian_unit_mu",
    "discrete_gaussian_mu",
    "pure_dp_mu",
]
