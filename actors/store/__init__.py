"""The receipt store actor: the owner of the store inside a dispatch system, its lanes and watches."""
