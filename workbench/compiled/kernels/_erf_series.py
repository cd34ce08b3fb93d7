"""The erf series shared by the numpy path (``workbench.ops.elementwise``) and the compiled
kernels (``transformer.erf_f32`` / ``erf_f64``): plain Python floats, no imports, so the
engine reads them without numba. Part of the compiled modules' source key
(:func:`workbench.compiled.cache.source_key`): an edit rebuilds the kernels.

Chebyshev coefficients, c0 first, of erf(x) / x in u = x*x / 2 - 1 (|x| < 2) and of
erfc(y) exp(y*y) in u = y / 2 - 2 (2 <= y <= 6), every one above 2**-60, computed with mpmath
at 160 bits (``python benchmarks/bench_erf.py --fit`` prints them again): facts about erf,
not fitted to any test. A float32 result keeps the leading terms above 2**-36
(:data:`TERMS_F32`). Both series are summed in float64 by Clenshaw's recurrence (stable in any
number of terms, unlike the power basis, whose high coefficients a conversion fills with
rounding noise).
"""

SMALL = (0.7415552820424018, -0.30107107338659495, 0.06899483068983156,
         -0.013916271264722188, 0.0024207995224334636, -0.0003658639685848086,
         4.862098443231905e-05, -5.749256558035685e-06, 6.113243578434765e-07,
         -5.8991015312958435e-08, 5.2070090920686485e-09, -4.2329758799655433e-10,
         3.188113506649175e-11, -2.2361550188326843e-12, 1.467329847991085e-13,
         -9.044001985381747e-15, 5.254813715470919e-16, -2.887426122284945e-17,
         1.5047851875576326e-18)
LARGE = (0.15454893254411423, -0.07674006034821483, 0.01849487416970198,
         -0.004337233595514166, 0.0009916839077238056, -0.00022144890703087983,
         4.836760032122529e-05, -1.034609832664543e-05, 2.1698719431920526e-06,
         -4.4664937548784355e-07, 9.031674382673662e-08, -1.7955339488870227e-08,
         3.5120800624763815e-09, -6.763532420163472e-10, 1.2831846446281688e-10,
         -2.3997023709710498e-11, 4.425938010116817e-12, -8.054583827182102e-13,
         1.446990739131772e-13, -2.5671711791155715e-14, 4.4996611900036674e-15,
         -7.794698095368683e-16, 1.3349408666512418e-16, -2.261037766442396e-17,
         3.7885091975244464e-18)
TERMS_F32 = (13, 16)

#: exp(t) for t in [-36, -4] (the tail's exp(-y*y)): 2**k * p(r), t = k ln2 + r, |r| <= ln2/2,
#: ln2 split so that k * LN2_HI is exact (its last 21 bits are zero); p: Taylor to r**12
#: (relative error below 2e-16), summed by Horner's rule from the highest power.
LOG2E = 1.4426950408889634
LN2_HI = 0.6931471803691238
LN2_LO = 1.9082149292705877e-10
EXP_TAYLOR = (1.0, 1.0, 1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 720, 1 / 5040, 1 / 40320,
              1 / 362880, 1 / 3628800, 1 / 39916800, 1 / 479001600)
