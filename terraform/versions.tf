terraform {
  # OpenTofu >= 1.8 or Terraform >= 1.6. `bin/setup` builds OpenTofu and the provider from their
  # Go modules (the Terraform registry is not reachable everywhere) and serves the provider from
  # a local filesystem mirror: see docs/clusters.md, "terraform/: topics and ACLs from the catalog".
  required_version = ">= 1.6.0"

  required_providers {
    kafka = {
      source  = "Mongey/kafka"
      version = "~> 0.13.1"
    }
  }
}
