"""lancetx.externalstore: external manifest stores (DynamoDB, in-memory) and the four-step commit."""
