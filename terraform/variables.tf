variable "catalog_path" {
  description = "The pipeline catalog (YAML). Default: catalog/pipelines.yaml of this checkout."
  type        = string
  default     = null
}

variable "environment" {
  description = "The catalog environment to apply (its `environments` section), as STREAMOPS_ENVIRONMENT selects it for the suite."
  type        = string
  default     = "local"

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]+$", var.environment))
    error_message = "environment must be a name of the catalog's environments section."
  }
}

variable "bootstrap_servers" {
  description = "Kafka bootstrap servers, e.g. [\"kafka-1:9092\", \"kafka-2:9092\"]."
  type        = list(string)
}

# --- connection security ---------------------------------------------------------------------

variable "tls_enabled" {
  description = "Connect with TLS."
  type        = bool
  default     = false
}

variable "skip_tls_verify" {
  description = "Do not verify the brokers' certificates (development clusters only)."
  type        = bool
  default     = false
}

variable "ca_cert" {
  description = "PEM of the CA that signed the brokers' certificates (TLS)."
  type        = string
  default     = null
}

variable "client_cert" {
  description = "PEM client certificate (mutual TLS)."
  type        = string
  default     = null
}

variable "client_key" {
  description = "PEM client key (mutual TLS)."
  type        = string
  default     = null
  sensitive   = true
}

variable "sasl_mechanism" {
  description = "SASL mechanism when sasl_username is set: plain, scram-sha256 or scram-sha512."
  type        = string
  default     = "plain"

  validation {
    condition     = contains(["plain", "scram-sha256", "scram-sha512"], var.sasl_mechanism)
    error_message = "sasl_mechanism must be plain, scram-sha256 or scram-sha512."
  }
}

variable "sasl_username" {
  description = "SASL user Terraform connects as (it needs to create topics and ACLs). Null: no SASL."
  type        = string
  default     = null
}

variable "sasl_password" {
  description = "SASL password."
  type        = string
  default     = null
  sensitive   = true
}

# --- access control ------------------------------------------------------------------------------

variable "manage_acls" {
  description = "Create each app's least-privilege ACLs. Needs a cluster with an authorizer."
  type        = bool
  default     = true
}

variable "app_principals" {
  description = "App name -> the principal its driver authenticates as. Apps not named get \"User:<app name>\"."
  type        = map(string)
  default     = {}
}
