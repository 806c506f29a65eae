# Every topic of the catalog, and each app's least-privilege ACLs, read from the one catalog with
# yamldecode: nothing here names a topic.

locals {
  catalog = yamldecode(file(coalesce(var.catalog_path, "${path.module}/../catalog/pipelines.yaml")))
  # The catalog's environment, resolved as plugins/streamops/catalog.py does: the environment's
  # per-topic override > the topic's own entry > the environment's topic_defaults.
  environment = try(local.catalog.environments[var.environment], {})
  topics = { for topic in local.catalog.topics : topic.name => merge(
    # An explicit null in an environment means "not set here" (as in the suite), not "unset".
    { for k, v in try(local.environment.topic_defaults, {}) : k => v if k != "configs" && v != null },
    topic,
    { for k, v in try(local.environment.topics[topic.name], {}) : k => v if k != "configs" && v != null },
    { configs = merge(
      try(local.environment.topic_defaults.configs, {}),
      try(topic.configs, {}),
      try(local.environment.topics[topic.name].configs, {}),
    ) },
  ) }
  apps = { for app in try(local.catalog.apps, []) : app.name => app }


  # One entry per (app, resource, operation): read inputs (and the outputs the app reads back: its
  # catalog entry's reads_outputs, which the catalog checks against the program), write outputs
  # and the dead-letter topic, use consumer groups under the app's own prefix; nothing else,
  # and no Create anywhere (topics are created here, not by the apps).
  # distinct: an output the app reads back is Described once.
  acl_entries = distinct(flatten([
    for name, app in local.apps : concat(
      [for pair in setproduct(distinct(concat(values(app.inputs), [for role in try(app.reads_outputs, []) : app.outputs[role]])), ["Read", "Describe"]) :
      { app = name, type = "Topic", pattern = "Literal", resource = pair[0], operation = pair[1] }],
      [for pair in setproduct(distinct(concat(values(app.outputs), [app.dead_letter_topic])), ["Write", "Describe"]) :
      { app = name, type = "Topic", pattern = "Literal", resource = pair[0], operation = pair[1] }],
      [{ app = name, type = "Group", pattern = "Prefixed", resource = "streamops.${name}", operation = "Read" }],
    )
  ]))
  acls = var.manage_acls ? { for e in local.acl_entries : "${e.app}|${e.type}|${e.resource}|${e.operation}" => e } : {}
}

provider "kafka" {
  bootstrap_servers = var.bootstrap_servers
  tls_enabled       = var.tls_enabled
  skip_tls_verify   = var.skip_tls_verify
  ca_cert           = var.ca_cert
  client_cert       = var.client_cert
  client_key        = var.client_key
  sasl_mechanism    = var.sasl_mechanism
  sasl_username     = var.sasl_username
  sasl_password     = var.sasl_password
}

resource "kafka_topic" "catalog" {
  for_each = local.topics

  name               = each.key
  partitions         = each.value.partitions
  replication_factor = each.value.replication_factor
  # As the broker reports them: strings, "compact, delete" without spaces (catalog.kafka_configs).
  config = { for key, value in try(each.value.configs, {}) : key => replace(tostring(value), " ", "") }

  lifecycle {
    # A topic removed from the catalog is not deleted with its data: Terraform stops with an
    # error instead. Delete on purpose: `tofu state rm`, then the broker's own tools.
    prevent_destroy = true

    precondition {
      condition     = try(local.catalog.environments, null) == null || contains(keys(try(local.catalog.environments, {})), var.environment)
      error_message = "The catalog has no environment \"${var.environment}\" under environments (var.environment)."
    }
    # The catalog's own checks (streamops catalog check refuses the same), for a catalog edited by hand.
    precondition {
      condition     = try(local.environment.brokers, null) == null || each.value.replication_factor <= try(local.environment.brokers, 0)
      error_message = "Topic ${each.key}: replication_factor ${each.value.replication_factor} is more than the ${try(local.environment.brokers, "?")} broker(s) of environment ${var.environment}."
    }
    precondition {
      condition     = !try(local.environment.tolerate_broker_loss, false) || tonumber(try(each.value.configs["min.insync.replicas"], 1)) < each.value.replication_factor
      error_message = "Topic ${each.key}: environment ${var.environment} must tolerate a broker loss, but min.insync.replicas ${try(each.value.configs["min.insync.replicas"], 1)} is not below replication_factor ${each.value.replication_factor}."
    }
  }
}

resource "kafka_acl" "apps" {
  for_each = local.acls

  acl_principal                = lookup(var.app_principals, each.value.app, "User:${each.value.app}")
  acl_host                     = "*"
  acl_operation                = each.value.operation
  acl_permission_type          = "Allow"
  resource_name                = each.value.resource
  resource_type                = each.value.type
  resource_pattern_type_filter = each.value.pattern

  # ACLs name topics: create them after the topics they protect.
  depends_on = [kafka_topic.catalog]
}
