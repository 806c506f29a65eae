output "topics" {
  description = "Topic name -> partitions and replication factor, as managed."
  value       = { for name, topic in kafka_topic.catalog : name => { partitions = topic.partitions, replication_factor = topic.replication_factor } }
}

output "acls" {
  description = "App -> its ACL entries (resource type, pattern, name, operation)."
  value       = { for app in keys(local.apps) : app => [for key, e in local.acls : "${e.type}:${e.pattern}:${e.resource}:${e.operation}" if e.app == app] }
}
