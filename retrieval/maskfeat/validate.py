"""MaskFeat pre-training's config checks (protocols.Validates), before any data work."""
from bengrapheme import errors
from retrieval.fragments import validate as fragment_checks


def validate(config):
  fragment_checks.check_data_fields(config)
  if config.model.name != 'vit':
    raise errors.ConfigError(f"model.name={config.model.name!r}: MaskFeat masks a ViT's "
                             "tokens; expected 'vit'")
  patch, pool = config.model.args.patch, config.maskfeat.hog_pool
  if pool < 1 or patch % pool:
    raise errors.ConfigError(f'maskfeat.hog_pool={pool!r}: expected a divisor of '
                             f'model.args.patch={patch}')
