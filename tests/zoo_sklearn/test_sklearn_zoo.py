"""The scikit-learn zoo: estimators and pipelines converted with skl2onnx at test time (small
synthetic data), run by the workbench and compared with two oracles:

- onnxruntime on the same ONNX file: labels exactly equal, scores within 1e-5 relative in
  float32 (1e-9 for the double pipelines);
- the estimator itself (``predict`` / ``predict_proba`` / ``transform``): labels exactly equal,
  scores within float32 round-off of the float64 computation (see ``SK_TOL``).

LightGBM and XGBoost go through onnxmltools where the packages are installed.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

skl2onnx = pytest.importorskip("skl2onnx")
ort = pytest.importorskip("onnxruntime")

from skl2onnx import to_onnx  # noqa: E402
from skl2onnx.common.data_types import (  # noqa: E402
    DictionaryType,
    FloatTensorType,
    StringTensorType,
)

import workbench.backend as backend  # noqa: E402

RNG = np.random.default_rng(0)
F32_RTOL, F32_ATOL = 1e-5, 1e-6
F64_RTOL, F64_ATOL = 1e-9, 1e-12
#: workbench vs the estimator's own float64 computation on float32 inputs (the ONNX models
#: compute in float32, so the estimator's scores are only matched to float32 round-off)
SK_TOL = dict(rtol=1e-4, atol=1e-5)


def _data(n=120, f=5, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, f)).astype(np.float32)
    w = rng.normal(size=(f, classes))
    y = np.argmax(X @ w + 0.3 * rng.normal(size=(n, classes)), axis=1)
    return X, y


def _reg(n=120, f=5, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, f)).astype(np.float32)
    y = X @ rng.normal(size=f) + 0.1 * rng.normal(size=n) + 3.0
    return X, y


# ------------------------------------------------------------------ comparison helpers


def _close(ours, ref, double, what):
    """rtol relative to each value, atol relative to the output's largest magnitude (a score
    near zero that is a sum of larger terms carries their absolute round-off)."""
    rtol, atol = (F64_RTOL, F64_ATOL) if double else (F32_RTOL, F32_ATOL)
    if not isinstance(ref, list) and np.asarray(ref).dtype.kind == "f" and np.size(ref):
        atol = max(atol, rtol * float(np.nanmax(np.abs(ref))))
    if isinstance(ref, list):
        assert isinstance(ours, list) and len(ours) == len(ref), what
        if ref and isinstance(ref[0], dict):
            for i, (a, b) in enumerate(zip(ours, ref)):
                assert list(a) == list(b), f"{what}[{i}]: keys {list(a)} != {list(b)}"
                np.testing.assert_allclose([a[k] for k in b], [b[k] for k in b], rtol=rtol,
                                           atol=atol, err_msg=f"{what}[{i}]")
            return
    ours, ref = np.asarray(ours), np.asarray(ref)
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != {ref.shape}"
    if ref.dtype.kind in "OUSib":
        assert ours.dtype.kind == ref.dtype.kind or ref.dtype.kind in "OU", what
        np.testing.assert_array_equal(ours, ref, err_msg=what)
    else:
        assert ours.dtype == ref.dtype, f"{what}: dtype {ours.dtype} != {ref.dtype}"
        np.testing.assert_allclose(ours, ref, rtol=rtol, atol=atol, err_msg=what)


def _as_matrix(z):
    if isinstance(z, list) and z and isinstance(z[0], dict):
        return np.array([[d[k] for k in d] for d in z])
    return np.asarray(z)


def check(model, feeds: dict, *, double=False, labels=None, proba=None, values=None):
    """Run ``model`` (ModelProto) on ``feeds`` in the workbench and onnxruntime; compare every
    output; then compare with the estimator's outputs given as ``labels`` (exact), ``proba``
    / ``values`` (SK_TOL, or 1e-9 for double pipelines)."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, feeds)
    rep = backend.prepare(model)
    ours = list(rep.run(feeds))
    names = [o.name for o in sess.get_outputs()]
    assert len(ours) == len(ref)
    for name, a, b in zip(names, ours, ref):
        _close(a, b, double, f"output {name!r} vs onnxruntime")
    tol = dict(rtol=1e-9, atol=1e-12) if double else SK_TOL
    if labels is not None:
        np.testing.assert_array_equal(np.asarray(ours[0]).reshape(-1), np.asarray(labels),
                                      err_msg="labels vs the estimator")
    if proba is not None:
        np.testing.assert_allclose(_as_matrix(ours[1]), proba, **tol,
                                   err_msg="probabilities vs the estimator")
    if values is not None:
        out = np.asarray(ours[0], dtype=np.float64)
        values = np.asarray(values, dtype=np.float64)
        np.testing.assert_allclose(out.reshape(values.shape) if out.size == values.size else out,
                                   values, **tol, err_msg="values vs the estimator")
    return ours


def _convert(est, X, ml=3, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return to_onnx(est, X[:1], target_opset={"": 17, "ai.onnx.ml": ml}, **kw)


# ------------------------------------------------------------------ the zoo


def _classifier_case(est, *, zipmap=True, classes=3, strings=False, seed=0, proba=True,
                     positive=False):
    X, y = _data(classes=classes, seed=seed)
    if positive:
        X = np.abs(X)
    if strings:
        y = np.array(["cat", "dog", "emu", "fox"])[y]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, y)
    opts = {id(est): {"zipmap": False}} if not zipmap else None
    onx = _convert(est, X, options=opts)
    p = est.predict_proba(X) if proba and hasattr(est, "predict_proba") else None
    return onx, {"X": X}, dict(labels=est.predict(X), proba=p)


def _regressor_case(est, seed=1, double=False, ml=3):
    """(skl2onnx's double-precision tree ensembles declare double outputs on the opset-3
    ensembles, whose outputs are float: onnxruntime refuses those files, so the zoo's double
    cases are the linear and matrix ones.)"""
    X, y = _reg(seed=seed)
    if double:
        X = X.astype(np.float64)
    est.fit(X, y)
    onx = _convert(est, X, ml=ml)
    return onx, {"X": X}, dict(values=est.predict(X), double=double)


def _transformer_case(est, X=None, double=False):
    if X is None:
        X, _ = _data()
        X = X * 3 + 1
    if double:
        X = X.astype(np.float64)
    est.fit(X)
    onx = _convert(est, X)
    return onx, {"X": X}, dict(values=est.transform(X), double=double)


def _zoo():
    from sklearn import (
        calibration,
        cluster,
        decomposition,
        ensemble,
        impute,
        linear_model,
        naive_bayes,
        neighbors,
        neural_network,
        preprocessing,
        svm,
        tree,
    )

    z = {}
    # linear
    z["LinearRegression"] = lambda: _regressor_case(linear_model.LinearRegression())
    z["LinearRegression-double"] = lambda: _regressor_case(linear_model.LinearRegression(),
                                                           double=True)
    z["Ridge"] = lambda: _regressor_case(linear_model.Ridge(alpha=0.5))
    z["ElasticNet"] = lambda: _regressor_case(linear_model.ElasticNet(alpha=0.01))
    z["LogisticRegression-binary-zipmap"] = lambda: _classifier_case(
        linear_model.LogisticRegression(), classes=2)
    z["LogisticRegression-multi"] = lambda: _classifier_case(
        linear_model.LogisticRegression(), zipmap=False)
    z["LogisticRegression-strings-zipmap"] = lambda: _classifier_case(
        linear_model.LogisticRegression(), strings=True, classes=4)
    z["SGDClassifier-hinge"] = lambda: _classifier_case(
        linear_model.SGDClassifier(random_state=0), proba=False, zipmap=False)
    z["LinearSVC-binary"] = lambda: _classifier_case(svm.LinearSVC(), classes=2, proba=False)
    z["LinearSVC-multi"] = lambda: _classifier_case(svm.LinearSVC(), proba=False)
    # kernel SVMs
    z["SVC-rbf-proba"] = lambda: _classifier_case(
        svm.SVC(probability=True, random_state=0), zipmap=False)
    z["SVC-rbf-binary-proba-strings"] = lambda: _classifier_case(
        svm.SVC(probability=True, random_state=0), classes=2, strings=True)
    z["SVC-rbf-binary-strings"] = lambda: _classifier_case(svm.SVC(), classes=2,
                                                           strings=True, proba=False,
                                                           zipmap=False)
    z["SVC-linear-multi"] = lambda: _classifier_case(svm.SVC(kernel="linear"), proba=False,
                                                     zipmap=False)
    z["SVC-poly-binary"] = lambda: _classifier_case(svm.SVC(kernel="poly", degree=2),
                                                    classes=2, proba=False, zipmap=False)
    z["SVR-rbf"] = lambda: _regressor_case(svm.SVR(C=3.0))
    z["NuSVR-sigmoid"] = lambda: _regressor_case(svm.NuSVR(kernel="sigmoid", gamma=0.05))
    z["LinearSVR"] = lambda: _regressor_case(svm.LinearSVR(random_state=0, max_iter=5000))

    def one_class():
        X, _ = _data()
        est = svm.OneClassSVM(nu=0.2).fit(X)
        return _convert(est, X), {"X": X}, dict(labels=est.predict(X))
    z["OneClassSVM"] = one_class
    # trees
    z["DecisionTreeClassifier"] = lambda: _classifier_case(
        tree.DecisionTreeClassifier(max_depth=6, random_state=0), zipmap=False)
    z["DecisionTreeClassifier-binary"] = lambda: _classifier_case(
        tree.DecisionTreeClassifier(max_depth=5, random_state=0), classes=2)
    z["DecisionTreeRegressor"] = lambda: _regressor_case(
        tree.DecisionTreeRegressor(max_depth=6, random_state=0))
    z["RandomForestClassifier"] = lambda: _classifier_case(
        ensemble.RandomForestClassifier(n_estimators=20, max_depth=6, random_state=0),
        zipmap=False)
    z["RandomForestRegressor"] = lambda: _regressor_case(
        ensemble.RandomForestRegressor(n_estimators=20, max_depth=6, random_state=0))
    z["ExtraTreesClassifier-binary-strings"] = lambda: _classifier_case(
        ensemble.ExtraTreesClassifier(n_estimators=15, max_depth=5, random_state=0),
        classes=2, strings=True)
    z["GradientBoostingClassifier-binary"] = lambda: _classifier_case(
        ensemble.GradientBoostingClassifier(n_estimators=20, random_state=0), classes=2)
    z["GradientBoostingClassifier-multi"] = lambda: _classifier_case(
        ensemble.GradientBoostingClassifier(n_estimators=15, random_state=0), zipmap=False)
    z["GradientBoostingRegressor"] = lambda: _regressor_case(
        ensemble.GradientBoostingRegressor(n_estimators=30, random_state=0))
    z["AdaBoostClassifier"] = lambda: _classifier_case(
        ensemble.AdaBoostClassifier(n_estimators=10, random_state=0), zipmap=False)
    # neighbours, Bayes, networks, clustering
    z["KNeighborsClassifier"] = lambda: _classifier_case(
        neighbors.KNeighborsClassifier(n_neighbors=5), zipmap=False)
    z["KNeighborsRegressor"] = lambda: _regressor_case(neighbors.KNeighborsRegressor(4))
    z["GaussianNB"] = lambda: _classifier_case(naive_bayes.GaussianNB(), zipmap=False)
    z["MultinomialNB"] = lambda: _classifier_case(naive_bayes.MultinomialNB(), zipmap=False,
                                                  positive=True)
    z["BernoulliNB"] = lambda: _classifier_case(naive_bayes.BernoulliNB(), zipmap=False)
    z["MLPClassifier"] = lambda: _classifier_case(
        neural_network.MLPClassifier(hidden_layer_sizes=(16,), max_iter=300, random_state=0),
        zipmap=False)
    z["MLPRegressor"] = lambda: _regressor_case(
        neural_network.MLPRegressor(hidden_layer_sizes=(16,), max_iter=300, random_state=0))

    def kmeans():
        X, _ = _data()
        est = cluster.KMeans(3, n_init=3, random_state=0).fit(X)
        return _convert(est, X), {"X": X}, dict(labels=est.predict(X))
    z["KMeans"] = kmeans
    z["PCA"] = lambda: _transformer_case(decomposition.PCA(3))
    z["TruncatedSVD"] = lambda: _transformer_case(decomposition.TruncatedSVD(3,
                                                                            random_state=0))
    # scalers, imputers, encoders
    for name in ("StandardScaler", "MinMaxScaler", "MaxAbsScaler", "RobustScaler"):
        z[name] = (lambda n: lambda: _transformer_case(getattr(preprocessing, n)()))(name)
    z["StandardScaler-double"] = lambda: _transformer_case(preprocessing.StandardScaler(),
                                                           double=True)
    z["Normalizer-l1"] = lambda: _transformer_case(preprocessing.Normalizer(norm="l1"))
    z["Normalizer-l2"] = lambda: _transformer_case(preprocessing.Normalizer(norm="l2"))
    # positive data: the ONNX spec (and onnxruntime) divide by max(x), scikit-learn by
    # max(|x|); they agree when the row's largest magnitude is positive
    z["Normalizer-max"] = lambda: _transformer_case(preprocessing.Normalizer(norm="max"),
                                                    X=np.abs(_data()[0]) + 0.1)
    z["Binarizer"] = lambda: _transformer_case(preprocessing.Binarizer(threshold=0.5))

    def imputer(strategy):
        def build():
            X, _ = _data()
            X[RNG.random(X.shape) < 0.15] = np.nan
            return _transformer_case(impute.SimpleImputer(strategy=strategy), X=X)
        return build
    z["SimpleImputer-mean"] = imputer("mean")
    z["SimpleImputer-median"] = imputer("median")
    z["SimpleImputer-most_frequent"] = imputer("most_frequent")

    z["PolynomialFeatures"] = lambda: _transformer_case(preprocessing.PolynomialFeatures(2))
    z["KBinsDiscretizer-onehot-dense"] = lambda: _transformer_case(
        preprocessing.KBinsDiscretizer(4, encode="onehot-dense", strategy="uniform"))
    z["PowerTransformer"] = lambda: _transformer_case(preprocessing.PowerTransformer(),
                                                      X=np.abs(_data()[0]) + 0.5)
    # double pipelines (1e-9)
    z["Pipeline-double-scaler-ridge"] = lambda: _regressor_case(
        __import__("sklearn.pipeline").pipeline.make_pipeline(
            preprocessing.StandardScaler(), linear_model.Ridge(alpha=0.3)), double=True)
    z["PCA-double"] = lambda: _transformer_case(decomposition.PCA(3), double=True)

    def onehot_strings():
        X = np.array([["red", "s"], ["blue", "m"], ["green", "l"], ["red", "m"]] * 5,
                     dtype=object)
        est = preprocessing.OneHotEncoder(handle_unknown="ignore").fit(X)
        Xt = np.array([["red", "l"], ["blue", "xl"], ["pink", "s"]], dtype=object)
        onx = _convert(est, Xt)
        return onx, {"X": Xt}, dict(values=est.transform(Xt).toarray())
    z["OneHotEncoder-strings-unknown"] = onehot_strings

    def onehot_ints():
        X = RNG.integers(0, 4, size=(30, 3)).astype(np.int64)
        est = preprocessing.OneHotEncoder(sparse_output=False).fit(X)
        return _convert(est, X), {"X": X}, dict(values=est.transform(X))
    z["OneHotEncoder-int64"] = onehot_ints

    def ordinal():
        X = np.array([["a", "x"], ["b", "y"], ["c", "x"], ["a", "z"]] * 3, dtype=object)
        est = preprocessing.OrdinalEncoder().fit(X)
        return _convert(est, X), {"X": X}, dict(values=est.transform(X))
    z["OrdinalEncoder"] = ordinal

    def label_encoder():
        y = np.array(["b", "a", "c", "a", "b"])
        est = preprocessing.LabelEncoder().fit(y)
        onx = to_onnx(est, initial_types=[("X", StringTensorType([None]))],
                      target_opset={"": 17, "ai.onnx.ml": 3})
        return onx, {"X": y.astype(object)}, dict(labels=est.transform(y))
    z["LabelEncoder"] = label_encoder

    def dict_vectorizer():
        from sklearn.feature_extraction import DictVectorizer
        rows = [{"a": 1.0, "b": 2.0}, {"b": 3.0, "c": 4.0}, {"a": 5.0, "d": 6.0}]
        est = DictVectorizer(sparse=False).fit(rows)
        onx = to_onnx(est, initial_types=[("X", DictionaryType(StringTensorType([1]),
                                                               FloatTensorType([1])))],
                      target_opset={"": 17, "ai.onnx.ml": 3})
        return onx, {"X": {"b": 3.0, "d": 6.0}}, dict(
            values=est.transform([{"b": 3.0, "d": 6.0}]))
    z["DictVectorizer-map-input"] = dict_vectorizer
    # ensembles of models
    z["CalibratedClassifierCV"] = lambda: _classifier_case(
        calibration.CalibratedClassifierCV(svm.LinearSVC(), cv=3), zipmap=False)
    z["VotingClassifier-soft"] = lambda: _classifier_case(
        ensemble.VotingClassifier([("lr", linear_model.LogisticRegression()),
                                   ("dt", tree.DecisionTreeClassifier(max_depth=4,
                                                                      random_state=0))],
                                  voting="soft", flatten_transform=False), zipmap=False)
    z["VotingRegressor"] = lambda: _regressor_case(
        ensemble.VotingRegressor([("lr", linear_model.LinearRegression()),
                                  ("rf", ensemble.RandomForestRegressor(
                                      n_estimators=5, max_depth=4, random_state=0))]))
    z["StackingClassifier"] = lambda: _classifier_case(
        ensemble.StackingClassifier([("lr", linear_model.LogisticRegression()),
                                     ("nb", naive_bayes.GaussianNB())],
                                    final_estimator=linear_model.LogisticRegression()),
        zipmap=False)
    z["Pipeline-scaler-pca-logreg"] = lambda: _classifier_case(
        __import__("sklearn.pipeline").pipeline.make_pipeline(
            preprocessing.StandardScaler(), decomposition.PCA(4),
            linear_model.LogisticRegression()))
    return z


ZOO = _zoo()


@pytest.mark.parametrize("name", sorted(ZOO))
def test_sklearn_zoo(name):
    onx, feeds, expect = ZOO[name]()
    check(onx, feeds, **expect)


def test_zoo_is_big_enough():
    assert len(ZOO) >= 30


# ------------------------------------------------------------------ text and mixed columns

DOCS = np.array(["the cat sat on the mat", "The dog ate my homework!", "cats and dogs",
                 "a mat for the cat", "dogs chase cats", "my cat, my mat"])


def _runnable_locale(onx):
    """onnxruntime's StringNormalizer builds a C++ locale (en_US.UTF-8 by default) and fails
    where it is not installed (minimal containers); lower-casing ASCII text is the same in
    C.UTF-8, so the model given to both engines names that one there."""
    import locale
    try:
        old = locale.setlocale(locale.LC_CTYPE)
        locale.setlocale(locale.LC_CTYPE, "en_US.UTF-8")
        locale.setlocale(locale.LC_CTYPE, old)
        return onx
    except locale.Error:
        pass
    from onnx import helper
    for node in onx.graph.node:
        if node.op_type == "StringNormalizer":
            kept = [a for a in node.attribute if a.name != "locale"]
            del node.attribute[:]
            node.attribute.extend(kept + [helper.make_attribute("locale", "C.UTF-8")])
    return onx


def _text_case(est, ngrams=(1, 1)):
    from skl2onnx.common.data_types import StringTensorType as S
    est.set_params(ngram_range=ngrams)
    est.fit(DOCS)
    onx = to_onnx(est, initial_types=[("X", S([None, 1]))],
                  target_opset={"": 17, "ai.onnx.ml": 3})
    onx = _runnable_locale(onx)
    feeds = {"X": DOCS.reshape(-1, 1)}
    return onx, feeds, dict(values=est.transform(DOCS).toarray())


def _feature_hasher(alternate_sign: bool):
    """FeatureHasher on strings: skl2onnx writes com.microsoft::MurmurHash3 (positive=0),
    then the sign and the modulo in ONNX ops."""
    from skl2onnx.common.data_types import StringTensorType as S
    from sklearn.feature_extraction import FeatureHasher
    words = np.array([d.split()[:3] for d in DOCS if len(d.split()) >= 3], dtype=object)
    words[0, 0] = "héllo wörld ✓"   # UTF-8 beyond ASCII
    est = FeatureHasher(n_features=32, input_type="string",
                        alternate_sign=alternate_sign).fit(words)
    onx = to_onnx(est, initial_types=[("X", S([None, words.shape[1]]))],
                  target_opset={"": 17, "ai.onnx.ml": 3})
    return onx, {"X": words}, dict(values=est.transform(words).toarray())


def _text_cases():
    from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer
    return {
        "CountVectorizer": lambda: _text_case(CountVectorizer()),
        "TfidfVectorizer-bigrams": lambda: _text_case(TfidfVectorizer(), (1, 2)),
        "FeatureHasher-strings": lambda: _feature_hasher(True),
        "FeatureHasher-strings-no-sign": lambda: _feature_hasher(False),
    }


def _column_transformer():
    from sklearn.compose import ColumnTransformer
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    rng = np.random.default_rng(3)
    n = len(DOCS) * 5
    num = rng.normal(size=(n, 2)).astype(np.float32)
    cat = rng.choice(["red", "green", "blue"], size=(n, 1)).astype(object)
    text = np.tile(DOCS, 5).reshape(-1, 1).astype(object)
    y = (num[:, 0] + (cat[:, 0] == "red") > 0.3).astype(np.int64)
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": num[:, 0], "b": num[:, 1], "color": cat[:, 0],
                       "text": text[:, 0]})
    pre = ColumnTransformer([("num", StandardScaler(), ["a", "b"]),
                             ("cat", OneHotEncoder(handle_unknown="ignore"), ["color"]),
                             ("txt", TfidfVectorizer(), "text")])
    pipe = Pipeline([("pre", pre), ("clf", LogisticRegression())]).fit(df, y)
    from skl2onnx.common.data_types import FloatTensorType as F
    from skl2onnx.common.data_types import StringTensorType as S
    onx = to_onnx(pipe, initial_types=[("a", F([None, 1])), ("b", F([None, 1])),
                                       ("color", S([None, 1])), ("text", S([None, 1]))],
                  target_opset={"": 17, "ai.onnx.ml": 3})
    onx = _runnable_locale(onx)
    feeds = {"a": num[:, :1], "b": num[:, 1:], "color": cat, "text": text}
    return onx, feeds, dict(labels=pipe.predict(df), proba=pipe.predict_proba(df))


ZOO.update(_text_cases())
ZOO["ColumnTransformer-numeric-categorical-text"] = _column_transformer


# ------------------------------------------------------------------ LightGBM and XGBoost


def _boosters():
    out = {}

    def lgbm(kind, classes):
        def build():
            lgb = pytest.importorskip("lightgbm")
            pytest.importorskip("onnxmltools")
            from onnxmltools import convert_lightgbm
            from onnxmltools.convert.common.data_types import FloatTensorType as F
            if kind == "clf":
                X, y = _data(classes=classes, seed=5)
                est = lgb.LGBMClassifier(n_estimators=20, num_leaves=8, verbose=-1).fit(X, y)
                expect = dict(labels=est.predict(X), proba=est.predict_proba(X))
            else:
                X, y = _reg(seed=5)
                est = lgb.LGBMRegressor(n_estimators=20, num_leaves=8, verbose=-1).fit(X, y)
                expect = dict(values=est.predict(X))
            onx = convert_lightgbm(est, initial_types=[("X", F([None, X.shape[1]]))],
                                   target_opset=15, zipmap=False)
            return onx, {"X": X}, expect
        return build

    def xgb(kind, classes):
        def build():
            xg = pytest.importorskip("xgboost")
            pytest.importorskip("onnxmltools")
            from onnxmltools import convert_xgboost
            from onnxmltools.convert.common.data_types import FloatTensorType as F
            if kind == "clf":
                X, y = _data(classes=classes, seed=6)
                est = xg.XGBClassifier(n_estimators=15, max_depth=3).fit(X, y)
                expect = dict(labels=est.predict(X), proba=est.predict_proba(X))
            else:
                X, y = _reg(seed=6)
                est = xg.XGBRegressor(n_estimators=15, max_depth=3).fit(X, y)
                expect = dict(values=est.predict(X))
            onx = convert_xgboost(est, initial_types=[("X", F([None, X.shape[1]]))],
                                  target_opset=15)
            return onx, {"X": X}, expect
        return build

    out["LGBMClassifier-binary"] = lgbm("clf", 2)
    out["LGBMClassifier-multi"] = lgbm("clf", 3)
    out["LGBMRegressor"] = lgbm("reg", 0)
    out["XGBClassifier-binary"] = xgb("clf", 2)
    out["XGBClassifier-multi"] = xgb("clf", 3)
    out["XGBRegressor"] = xgb("reg", 0)
    return out


BOOSTERS = _boosters()


@pytest.mark.parametrize("name", sorted(set(ZOO) - set(_zoo())))
def test_sklearn_zoo_text_and_columns(name):
    onx, feeds, expect = ZOO[name]()
    check(onx, feeds, **expect)


@pytest.mark.parametrize("name", sorted(BOOSTERS))
def test_boosters_through_onnxmltools(name):
    onx, feeds, expect = BOOSTERS[name]()
    check(onx, feeds, **expect)
