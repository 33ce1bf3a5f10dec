"""The admin client's config calls: DescribeConfigs and IncrementalAlterConfigs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pipeline.cluster.admin_sender import AdminSender, error_or_none, unique_names
from pipeline.cluster.admin_types import AdminError, ConfigEntry, ConfigSource
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import describe_configs as dc
from pipeline.protocol.messages import incremental_alter_configs as iac

__all__ = ["alter_configs", "describe_configs"]

_SET, _DELETE = 0, 1  # IncrementalAlterConfigs operations


async def describe_configs(
    sender: AdminSender, rtype: int, name: str, names: Iterable[str] | None, *, node: int | None
) -> dict[str, ConfigEntry]:
    """The configs of one resource (``names`` only, or all); raises its error."""
    keys = None if names is None else tuple(unique_names(names))
    resource = dc.DescribeConfigsResource(
        resource_type=rtype, resource_name=name, configuration_keys=keys
    )

    def build(version: int, timeout_ms: int) -> dc.DescribeConfigsRequest:
        return dc.DescribeConfigsRequest(resources=(resource,))

    response = await sender.call(ApiKey.DESCRIBE_CONFIGS, build, node=node)
    for result in response.results:
        error = error_or_none(result.error_code, result.error_message, name)
        if error is not None:
            raise error
        return {
            c.name: ConfigEntry(
                name=c.name,
                value=c.value,
                source=config_source(c.config_source),
                read_only=c.read_only,
                sensitive=c.is_sensitive,
            )
            for c in result.configs
        }
    raise AdminError(ErrorCode.UNKNOWN_SERVER_ERROR, "no result in the response", resource=name)


async def alter_configs(
    sender: AdminSender,
    rtype: int,
    name: str,
    to_set: Mapping[str, str],
    delete: Iterable[str],
    validate_only: bool,
    *,
    node: int | None,
) -> None:
    """Set ``to_set`` and delete (back to the default) ``delete``; raises the resource's
    error (INVALID_CONFIG, UNKNOWN_TOPIC_OR_PARTITION...)."""
    ops = [iac.AlterableConfig(name=k, config_operation=_SET, value=v)
           for k, v in to_set.items()]
    ops += [iac.AlterableConfig(name=k, config_operation=_DELETE, value=None)
            for k in unique_names(delete)]
    if not ops:
        return
    resource = iac.AlterConfigsResource(
        resource_type=rtype, resource_name=name, configs=tuple(ops)
    )

    def build(version: int, timeout_ms: int) -> iac.IncrementalAlterConfigsRequest:
        return iac.IncrementalAlterConfigsRequest(
            resources=(resource,), validate_only=validate_only
        )

    response = await sender.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, build, node=node)
    for r in response.responses:
        error = error_or_none(r.error_code, r.error_message, name)
        if error is not None:
            raise error


def config_source(value: int) -> ConfigSource:
    """The enum member, UNKNOWN for a value this client does not know."""
    try:
        return ConfigSource(value)
    except ValueError:
        return ConfigSource.UNKNOWN
